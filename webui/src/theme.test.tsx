import { Anchor, Button, Drawer, Modal, Table } from "@mantine/core";
import { screen, within } from "@testing-library/react";
import axe from "axe-core";
import { describe, expect, it } from "vitest";
import { renderWith } from "./test/render";

describe("the theme names what an icon alone would not", () => {
  it("every dialog's and drawer's × has an accessible name (axe: button-name)", async () => {
    renderWith(<>
      <Modal opened onClose={() => undefined} title="A dialog">body</Modal>
      <Drawer opened onClose={() => undefined} title="A drawer">body</Drawer>
    </>);
    expect(within(screen.getByRole("dialog", { name: "A dialog" })).getByRole("button", { name: "Close dialog" }))
      .toBeInTheDocument();
    expect(within(screen.getByRole("dialog", { name: "A drawer" })).getByRole("button", { name: "Close panel" }))
      .toBeInTheDocument();
    const found = await axe.run(document.body, { runOnly: { type: "rule", values: ["button-name"] } });
    expect(found.violations.map((v) => v.id)).toEqual([]);
  });
});

describe("the theme keeps contrast and keyboard reach that a page cannot see (axe at 375 px, dark)", () => {
  it("a red button is red 8 (white on it 5.7:1, on red 6 3.3:1); others keep Mantine's", () => {
    renderWith(<><Button color="red">Revoke</Button><Button color="red" variant="light">Light</Button><Button>Ink</Button></>);
    expect(screen.getByRole("button", { name: "Revoke" }).getAttribute("style")).toContain("--button-bg: var(--mantine-color-red-8)");
    expect(screen.getByRole("button", { name: "Light" }).getAttribute("style") ?? "").not.toContain("red-8");
    expect(screen.getByRole("button", { name: "Ink" }).getAttribute("style") ?? "").not.toContain("red-8");
  });

  it("a link is underlined, not told from its sentence by colour alone", () => {
    renderWith(<p>see <Anchor href="#/keys/k">the key</Anchor></p>);
    expect(screen.getByRole("link", { name: "the key" })).toHaveAttribute("data-underline", "always");
  });

  it("a table's scroll box can be reached by the keyboard", () => {
    const { container } = renderWith(<Table.ScrollContainer minWidth={900}><Table><Table.Tbody><Table.Tr><Table.Td>x</Table.Td></Table.Tr></Table.Tbody></Table></Table.ScrollContainer>);
    expect(container.querySelector(".mantine-ScrollArea-viewport")).toHaveAttribute("tabindex", "0");
  });
});
