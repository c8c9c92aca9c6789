// Try a key on data without leaving the browser (as Vault's UI offers for transit keys):
// encrypt and decrypt with an AES key, compute and verify a MAC with an HMAC key. The key
// never leaves the HSM; each operation is an ordinary, authorised and audited API call.
// Plaintext lives only in this component's state: never in the URL, storage or query cache.
import {
  Alert, Button, Code, CopyButton, Group, Paper, SegmentedControl, Stack, Tabs, Text, Textarea, TextInput, Title, Tooltip,
} from "@mantine/core";
import { useMutation } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { api, call, type Key } from "../api/client";
import { useAuth, type Permission } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";

/** The server's limit on data per operation. */
export const MAX_BYTES = 1 << 20;

type Encoding = "text" | "base64";

export function toBytes(value: string, encoding: Encoding): Uint8Array {
  if (encoding === "text") return new TextEncoder().encode(value);
  const bin = atob(value.replace(/\s+/g, ""));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

export function toBase64(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/** The bytes as text when they are valid UTF-8, else null. */
export function asText(bytes: Uint8Array): string | null {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return null;
  }
}

/** What Encrypt hands out and Decrypt takes: everything needed to decrypt, in one string. */
export interface Envelope { v: number | null; iv: string; tag: string | null; ciphertext: string }

export function parseEnvelope(text: string): Envelope | string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return "Paste the whole envelope that Encrypt made: a JSON object with v, iv, tag and ciphertext.";
  }
  const e = parsed as Partial<Envelope>;
  if (typeof e !== "object" || e === null || typeof e.ciphertext !== "string" || typeof e.iv !== "string") {
    return "The envelope needs at least ciphertext and iv (base64).";
  }
  return { v: typeof e.v === "number" ? e.v : null, iv: e.iv, tag: typeof e.tag === "string" ? e.tag : null,
           ciphertext: e.ciphertext };
}

function useInput() {
  const [value, setValue] = useState("");
  const [encoding, setEncoding] = useState<Encoding>("text");
  let bytes: Uint8Array | null = null;
  let problem: string | null = null;
  try {
    bytes = toBytes(value, encoding);
    if (bytes.length > MAX_BYTES) problem = `At most 1 MiB per operation (this is ${bytes.length.toLocaleString()} bytes).`;
  } catch {
    problem = "This is not base64: use letters, digits, +, / and = padding, or switch to text.";
  }
  return { value, setValue, encoding, setEncoding, bytes, problem, reset: () => setValue("") };
}

function DataInput({ label, input, description }: {
  label: string; input: ReturnType<typeof useInput>; description?: string;
}) {
  return (
    <Stack gap={4}>
      <Group justify="space-between" align="flex-end">
        <Text size="sm" fw={500} component="label" htmlFor={`${label}-input`}>{label}</Text>
        <SegmentedControl size="xs" value={input.encoding} onChange={(v) => input.setEncoding(v as Encoding)}
                          aria-label={`${label} is`} data={[{ value: "text", label: "Text" }, { value: "base64", label: "Base64" }]} />
      </Group>
      <Textarea id={`${label}-input`} autosize minRows={3} maxRows={10} value={input.value} description={description}
                onChange={(e) => input.setValue(e.currentTarget.value)} error={input.value ? input.problem : null}
                styles={{ input: { fontFamily: input.encoding === "base64" ? "var(--mantine-font-family-monospace)" : undefined } }}
                autoComplete="off" spellCheck={false} />
    </Stack>
  );
}

function Output({ label, value, testId }: { label: string; value: string; testId: string }) {
  return (
    <Stack gap={4} role="region" aria-label={label}>
      <Group justify="space-between">
        <Text size="sm" fw={500}>{label}</Text>
        <CopyButton value={value}>
          {({ copied, copy }) => <Button size="compact-xs" variant="default" onClick={copy}>{copied ? "Copied" : "Copy"}</Button>}
        </CopyButton>
      </Group>
      <Code block data-testid={testId} style={{ whiteSpace: "pre-wrap", wordBreak: "break-all" }}>{value}</Code>
    </Stack>
  );
}

function Disabled({ why, children }: { why: string | null; children: React.ReactNode }) {
  return why ? <Tooltip label={why} multiline w={260}><span>{children}</span></Tooltip> : <>{children}</>;
}

function EncryptTab({ k }: { k: Key }) {
  const input = useInput();
  const aad = useState("");
  const encrypt = useMutation({
    mutationFn: () => call(api.POST("/api/v1/keys/{key_ref}/encrypt", { params: { path: { key_ref: k.id } }, body: {
      plaintext: toBase64(input.bytes!), aad: aad[0] ? toBase64(new TextEncoder().encode(aad[0])) : undefined } })),
  });
  const envelope = encrypt.data ? JSON.stringify({ v: encrypt.data.version ?? null, iv: encrypt.data.iv,
                                                   tag: encrypt.data.tag, ciphertext: encrypt.data.ciphertext }) : null;
  return (
    <Stack gap="sm">
      <DataInput label="Plaintext" input={input} />
      <TextInput label="Associated data (optional)" description="Authenticated, not encrypted: the same text is needed to decrypt"
                 value={aad[0]} onChange={(e) => aad[1](e.currentTarget.value)} autoComplete="off" />
      <Group>
        <Button color="ink" disabled={!input.value || !!input.problem} loading={encrypt.isPending}
                onClick={() => encrypt.mutate()} data-testid="encrypt-submit">Encrypt with v{k.current_version}</Button>
        <Text size="xs" c="dimmed">AES-256-GCM in the HSM, with an IV the HSM draws</Text>
      </Group>
      <ErrorAlert error={encrypt.error} />
      {envelope && <Output label="Envelope (paste it into Decrypt)" value={envelope} testId="encrypt-envelope" />}
    </Stack>
  );
}

function DecryptTab({ k }: { k: Key }) {
  const [envelope, setEnvelope] = useState("");
  const [aad, setAad] = useState("");
  const [show, setShow] = useState<Encoding>("text");
  const parsed = envelope.trim() ? parseEnvelope(envelope.trim()) : null;
  const problem = typeof parsed === "string" ? parsed : null;
  const decrypt = useMutation({
    mutationFn: (e: Envelope) => call(api.POST("/api/v1/keys/{key_ref}/decrypt", { params: { path: { key_ref: k.id } }, body: {
      ciphertext: e.ciphertext, iv: e.iv, tag: e.tag ?? undefined, version: e.v ?? undefined,
      aad: aad ? toBase64(new TextEncoder().encode(aad)) : undefined } })),
  });
  const plain = decrypt.data ? toBytes(decrypt.data.plaintext, "base64") : null;
  const text = plain ? asText(plain) : null;
  return (
    <Stack gap="sm">
      <Textarea label="Envelope" description="As Encrypt made it: {&quot;v&quot;, &quot;iv&quot;, &quot;tag&quot;, &quot;ciphertext&quot;}"
                autosize minRows={3} maxRows={8} value={envelope} error={problem}
                onChange={(e) => setEnvelope(e.currentTarget.value)} autoComplete="off" spellCheck={false}
                styles={{ input: { fontFamily: "var(--mantine-font-family-monospace)" } }} />
      <TextInput label="Associated data (if it was given)" value={aad} onChange={(e) => setAad(e.currentTarget.value)} autoComplete="off" />
      <Group>
        <Button color="ink" disabled={!parsed || !!problem} loading={decrypt.isPending}
                onClick={() => typeof parsed === "object" && parsed && decrypt.mutate(parsed)} data-testid="decrypt-submit">
          Decrypt</Button>
        {typeof parsed === "object" && parsed?.v && <Text size="xs" c="dimmed">with v{parsed.v}, the version that encrypted</Text>}
      </Group>
      <ErrorAlert error={decrypt.error} />
      {plain && (
        <Stack gap={4}>
          {text !== null && (
            <SegmentedControl size="xs" w={160} value={show} onChange={(v) => setShow(v as Encoding)} aria-label="Show plaintext as"
                              data={[{ value: "text", label: "Text" }, { value: "base64", label: "Base64" }]} />
          )}
          <Output label={text !== null && show === "text" ? "Plaintext" : "Plaintext (base64: not UTF-8 text)"}
                  value={text !== null && show === "text" ? text : toBase64(plain)} testId="decrypt-plaintext" />
        </Stack>
      )}
    </Stack>
  );
}

function MacTab({ k, verify }: { k: Key; verify: boolean }) {
  const input = useInput();
  const [mac, setMac] = useState("");
  const run = useMutation({
    mutationFn: () => call(api.POST("/api/v1/keys/{key_ref}/mac", { params: { path: { key_ref: k.id } }, body: {
      data: toBase64(input.bytes!), ...(verify ? { mac: mac.trim() } : {}) } })),
  });
  return (
    <Stack gap="sm">
      <DataInput label="Data" input={input} />
      {verify && <TextInput label="MAC (base64)" value={mac} onChange={(e) => setMac(e.currentTarget.value)} autoComplete="off" />}
      <Group>
        <Button color="ink" disabled={!input.value || !!input.problem || (verify && !mac.trim())} loading={run.isPending}
                onClick={() => run.mutate()} data-testid={verify ? "verify-mac-submit" : "mac-submit"}>
          {verify ? "Verify" : "Compute MAC"}</Button>
      </Group>
      <ErrorAlert error={run.error} />
      {run.data?.mac && <Output label="MAC (base64)" value={run.data.mac} testId="mac-output" />}
      {run.data && run.data.valid !== null && run.data.valid !== undefined && (
        <Alert color={run.data.valid ? "teal" : "red"} variant="light" data-testid="mac-verdict"
               title={run.data.valid ? "Valid: this MAC was made with this key over this data" : "Not valid"}>
          {run.data.valid ? null : "The data, the MAC or the key differ from those that made it."}
        </Alert>
      )}
    </Stack>
  );
}

/** Why an operation cannot run on this key now, or null. */
function refusal(k: Key, op: "encrypt" | "decrypt", can: (p: Permission) => boolean): string | null {
  const perm: Permission = op === "decrypt" ? "keys:decrypt" : "keys:encrypt";
  if (!can(perm)) return `Needs the ${perm} permission.`;
  if (op === "encrypt" && k.state !== "active") {
    return k.state === "pre-active" ? "Activate the key first: a pre-active key does not encrypt yet."
      : "Only an active key encrypts; deactivated, revoked and compromised keys still decrypt.";
  }
  return null;
}

export function KeyCryptoPanel({ k }: { k: Key }) {
  const { can } = useAuth();
  const hmac = k.algorithm.toUpperCase().startsWith("HMAC");
  const destroyed = k.state === "destroyed" || k.state === "destroyed-compromised";
  const first = hmac ? "mac" : "encrypt";
  const [tab, setTab] = useState<string | null>(first);
  useEffect(() => { setTab(first); }, [k.id, first]);
  if (destroyed) {
    return (
      <Paper withBorder radius="md" p="md">
        <Title order={2} size="h5" mb={4}>Try this key</Title>
        <Text size="sm" c="dimmed">Its material is destroyed: nothing can be encrypted or decrypted with it any more.</Text>
      </Paper>
    );
  }
  const encryptWhy = refusal(k, "encrypt", can);
  const decryptWhy = refusal(k, "decrypt", can);
  const verifyWhy = can("keys:verify") ? null : "Needs the keys:verify permission.";
  const tabs = hmac
    ? [{ value: "mac", label: "MAC", why: encryptWhy }, { value: "verify", label: "Verify MAC", why: verifyWhy }]
    : [{ value: "encrypt", label: "Encrypt", why: encryptWhy }, { value: "decrypt", label: "Decrypt", why: decryptWhy }];
  const open = tabs.find((t) => t.value === tab && !t.why) ?? tabs.find((t) => !t.why);
  return (
    <Paper withBorder radius="md" p="md" data-testid="key-crypto">
      <Title order={2} size="h5" mb={4}>Try this key</Title>
      <Text size="xs" c="dimmed" mb="sm">The key stays in the HSM; each operation is authorised and audited like any API call.</Text>
      {!open ? <Text size="sm" c="dimmed">{tabs[0].why}</Text> : (
        <Tabs value={open.value} onChange={setTab} keepMounted={false}>
          <Tabs.List mb="sm">
            {tabs.map((t) => (
              <Disabled key={t.value} why={t.why}>
                <Tabs.Tab value={t.value} disabled={!!t.why}>{t.label}</Tabs.Tab>
              </Disabled>
            ))}
          </Tabs.List>
          <Tabs.Panel value="encrypt"><EncryptTab key={k.id} k={k} /></Tabs.Panel>
          <Tabs.Panel value="decrypt"><DecryptTab key={k.id} k={k} /></Tabs.Panel>
          <Tabs.Panel value="mac"><MacTab key={k.id} k={k} verify={false} /></Tabs.Panel>
          <Tabs.Panel value="verify"><MacTab key={`${k.id}-v`} k={k} verify /></Tabs.Panel>
        </Tabs>
      )}
    </Paper>
  );
}
