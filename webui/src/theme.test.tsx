import { Drawer, Modal } from "@mantine/core";
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
