import { fireEvent, screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { describe, expect, it } from "vitest";
import type { Key } from "../api/client";
import { fakeApi, problem } from "../test/fakeApi";
import { meAs, renderWith } from "../test/render";
import { KeyCryptoPanel, MAX_BYTES, asText, parseEnvelope, toBase64, toBytes } from "./KeyCrypto";

const key = (over: Partial<Key> = {}): Key => ({
  id: "6603c18c-39c3-4619-bb48-e05423636617", name: "payments-db", description: "", owner: "alice", tags: {},
  algorithm: "AES", length_bits: 256, state: "active", current_version: 2, created_at: "2026-11-22T00:00:00Z",
  updated_at: "2026-11-22T00:01:00Z", rotation_period_days: null, next_rotation_at: null, exportable: true, kmip_group: null,
  versions: [], ...over,
});
const b64 = (s: string) => toBase64(new TextEncoder().encode(s));

describe("trying a key from the console", () => {
  it("encrypts typed text and hands out an envelope that Decrypt takes back", async () => {
    const server = fakeApi({
      "POST /api/v1/keys/:ref/encrypt": { key_id: "v-2", version: 2, ciphertext: "Q0lQSEVS", iv: "SVY=", tag: "VEFH" },
      "POST /api/v1/keys/:ref/decrypt": { plaintext: b64("card 4242 — ok") },
    });
    renderWith(<KeyCryptoPanel k={key()} />, { me: meAs("operator") });
    await userEvent.type(screen.getByLabelText("Plaintext"), "card 4242 — ok");
    await userEvent.click(screen.getByTestId("encrypt-submit"));
    const envelope = await screen.findByTestId("encrypt-envelope");
    expect(server.calls("POST /api/v1/keys/:ref/encrypt")[0].body).toEqual({ plaintext: b64("card 4242 — ok") });
    expect(JSON.parse(envelope.textContent!)).toEqual({ v: 2, iv: "SVY=", tag: "VEFH", ciphertext: "Q0lQSEVS" });

    await userEvent.click(screen.getByRole("tab", { name: "Decrypt" }));
    const field = screen.getByLabelText("Envelope");
    await userEvent.click(field);
    await userEvent.paste(envelope.textContent!);
    await userEvent.click(screen.getByTestId("decrypt-submit"));
    expect(await screen.findByTestId("decrypt-plaintext")).toHaveTextContent("card 4242 — ok");
    expect(server.calls("POST /api/v1/keys/:ref/decrypt")[0].body).toEqual(
      { ciphertext: "Q0lQSEVS", iv: "SVY=", tag: "VEFH", version: 2 });
    expect(screen.getByRole("region", { name: "Plaintext" })).toBeInTheDocument();
  });

  it("shows bytes that are not text as base64", async () => {
    fakeApi({ "POST /api/v1/keys/:ref/decrypt": { plaintext: toBase64(new Uint8Array([0xff, 0xfe, 0x00])) } });
    renderWith(<KeyCryptoPanel k={key()} />, { me: meAs("operator") });
    await userEvent.click(screen.getByRole("tab", { name: "Decrypt" }));
    await userEvent.click(screen.getByLabelText("Envelope"));
    await userEvent.paste('{"v":1,"iv":"SVY=","tag":"VEFH","ciphertext":"Q0lQSEVS"}');
    await userEvent.click(screen.getByTestId("decrypt-submit"));
    expect(await screen.findByTestId("decrypt-plaintext")).toHaveTextContent("//4A");
    expect(screen.getByText("Plaintext (base64: not UTF-8 text)")).toBeInTheDocument();
  });

  it("an auditor may not encrypt or decrypt: says which permission, and sends nothing", async () => {
    const server = fakeApi({});
    renderWith(<KeyCryptoPanel k={key()} />, { me: meAs("auditor") });
    expect(screen.getByTestId("key-crypto")).toHaveTextContent("Needs the keys:encrypt permission.");
    expect(screen.queryByTestId("encrypt-submit")).toBeNull();
    expect(server.calls("POST /api/v1/keys/:ref/encrypt")).toHaveLength(0);
  });

  it("a deactivated key only decrypts, and says why", async () => {
    renderWith(<KeyCryptoPanel k={key({ state: "deactivated" })} />, { me: meAs("operator") });
    expect(screen.getByRole("tab", { name: "Encrypt" })).toBeDisabled();
    expect(screen.getByRole("tab", { name: "Decrypt" })).toHaveAttribute("aria-selected", "true");
    await userEvent.hover(screen.getByRole("tab", { name: "Encrypt" }).parentElement!);
    expect(await screen.findByText(/Only an active key encrypts/)).toBeInTheDocument();
  });

  it("a destroyed key offers nothing to try", () => {
    renderWith(<KeyCryptoPanel k={key({ state: "destroyed" })} />, { me: meAs("admin") });
    expect(screen.getByText(/Its material is destroyed/)).toBeInTheDocument();
    expect(screen.queryByRole("tab")).toBeNull();
  });

  it("an HMAC key computes and verifies MACs", async () => {
    const server = fakeApi({
      "POST /api/v1/keys/:ref/mac": ({ body }) => ((body as { mac?: string }).mac
        ? { mac: null, valid: (body as { mac: string }).mac === "TUFD" } : { mac: "TUFD", valid: null }),
    });
    renderWith(<KeyCryptoPanel k={key({ algorithm: "HMAC-SHA256" })} />, { me: meAs("admin") });
    await userEvent.type(screen.getByLabelText("Data"), "hello");
    await userEvent.click(screen.getByTestId("mac-submit"));
    expect(await screen.findByTestId("mac-output")).toHaveTextContent("TUFD");
    await userEvent.click(screen.getByRole("tab", { name: "Verify MAC" }));
    await userEvent.type(screen.getByLabelText("Data"), "hello");
    await userEvent.type(screen.getByLabelText("MAC (base64)"), "WRONG");
    await userEvent.click(screen.getByTestId("verify-mac-submit"));
    expect(await screen.findByTestId("mac-verdict")).toHaveTextContent("Not valid");
    expect(server.calls("POST /api/v1/keys/:ref/mac").at(-1)?.body).toEqual({ data: b64("hello"), mac: "WRONG" });
  });

  it("shows the server's refusal with what to do", async () => {
    fakeApi({ "POST /api/v1/keys/:ref/encrypt": () => problem(409, "gcm_limit", "version 2 has made 2^32 encryptions") });
    renderWith(<KeyCryptoPanel k={key()} />, { me: meAs("admin") });
    await userEvent.type(screen.getByLabelText("Plaintext"), "x");
    await userEvent.click(screen.getByTestId("encrypt-submit"));
    expect(await screen.findByRole("alert")).toHaveTextContent("version 2 has made 2^32 encryptions");
  });

  it("refuses bad base64 and more than 1 MiB before any request", async () => {
    const server = fakeApi({});
    renderWith(<KeyCryptoPanel k={key()} />, { me: meAs("admin") });
    await userEvent.click(screen.getByRole("radio", { name: "Base64" }));
    await userEvent.type(screen.getByLabelText("Plaintext"), "not base64!");
    expect(await screen.findByText(/This is not base64/)).toBeInTheDocument();
    expect(screen.getByTestId("encrypt-submit")).toBeDisabled();
    await userEvent.click(screen.getByRole("radio", { name: "Text" }));
    fireEvent.change(screen.getByLabelText("Plaintext"), { target: { value: "a".repeat(MAX_BYTES + 1) } });
    expect(await screen.findByText(/At most 1 MiB per operation/)).toBeInTheDocument();
    expect(screen.getByTestId("encrypt-submit")).toBeDisabled();
    expect(server.calls("POST /api/v1/keys/:ref/encrypt")).toHaveLength(0);
    expect(toBytes("aGk=", "base64")).toEqual(new Uint8Array([104, 105]));
  });

  it("helpers: envelopes, text detection", () => {
    expect(parseEnvelope("nope")).toMatch(/Paste the whole envelope/);
    expect(parseEnvelope('{"iv":"a"}')).toMatch(/needs at least ciphertext and iv/);
    expect(parseEnvelope('{"v":3,"iv":"a","ciphertext":"b"}')).toEqual({ v: 3, iv: "a", tag: null, ciphertext: "b" });
    expect(asText(new Uint8Array([0xc3, 0xa9]))).toBe("é");
    expect(asText(new Uint8Array([0xc3]))).toBeNull();
    expect(within(document.body).queryByRole("alert")).toBeNull();
  });
});
