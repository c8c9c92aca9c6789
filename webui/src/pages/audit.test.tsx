import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import { fakeApi } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { ChainStatus } from "./Dashboard";

const ago = (seconds: number) => new Date(Date.now() - seconds * 1000).toISOString();
const STATUS = {
  head_seq: 5120, key_fingerprint: "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12",
  public_key_pem: "-----BEGIN PUBLIC KEY-----\n…\n-----END PUBLIC KEY-----\n",
  last_checkpoint: { checkpoint: 5, seq: 5000, hash: "f".repeat(64), time: ago(120), prev: "0".repeat(64),
                     key: "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12", signature: "MEUCIQ==" },
  verified: { checkpoint: 4, seq: 4000, at: ago(3600) },
};

describe("the dashboard's audit chain panel", () => {
  it("shows the last checkpoint and verification without walking the chain on load", async () => {
    const server = fakeApi({ "GET /api/v1/audit/status": STATUS });
    renderWith(<ChainStatus />, { me: meAs("auditor") });
    expect(await screen.findByText("Verified to checkpoint #4")).toBeInTheDocument();
    expect(screen.getByText(/#5 at record 5000/)).toBeInTheDocument();
    expect(screen.getByText("1120 records")).toBeInTheDocument(); // head 5120 − verified checkpoint at 4000
    expect(server.calls("POST /api/v1/audit/verify")).toHaveLength(0);
  });

  it("verifies on request, from the last verified checkpoint, and says how far it went", async () => {
    const server = fakeApi({
      "GET /api/v1/audit/status": STATUS,
      "POST /api/v1/audit/verify": { ok: true, checked: 1120, head_seq: 5120, first_broken_seq: null, reason: null,
                                     from_seq: 4000, checkpoint: 5, outside_checked: 0 },
    });
    renderWith(<ChainStatus />, { me: meAs("auditor") });
    await userEvent.click(await screen.findByRole("button", { name: "Verify now" }));
    expect(await screen.findByText("1120 (after record #4000)")).toBeInTheDocument();
    await waitFor(() => expect(server.calls("POST /api/v1/audit/verify")).toHaveLength(1));
    expect(server.calls("GET /api/v1/audit/status").length).toBeGreaterThanOrEqual(2); // refreshed after
  });

  it("says when nothing was verified yet, and offers no button without audit:verify", async () => {
    fakeApi({ "GET /api/v1/audit/status": { ...STATUS, verified: null, last_checkpoint: null } });
    renderWith(<ChainStatus />, { me: meAs("operator") });
    expect(await screen.findByText("Not verified yet")).toBeInTheDocument();
    expect(screen.getByText("none yet")).toBeInTheDocument();
    expect(screen.queryByRole("button", { name: "Verify now" })).toBeNull();
  });
});
