// End-to-end tests of the web console in a real browser: Debian's Chromium driven by
// playwright-core (no browser download), against a real keyserver (PostgreSQL + SoftHSM2
// when run by tests/webui/test_e2e.py). Node's own test runner; run with
//   BASE_URL=... ADMIN_USER=... ADMIN_OTP=... AUDITOR_USER=... AUDITOR_PASSWORD=... node e2e/run.mjs
// The admin signs in once (first-run password change included); later tests reuse the
// stored browser state. Screenshots of each main page go to SCREENSHOT_DIR.
import assert from "node:assert/strict";
import { X509Certificate, createHmac } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`set ${name}`);
  return v;
};
const BASE_URL = env("BASE_URL").replace(/\/$/, "");
const ADMIN_USER = env("ADMIN_USER");
const ADMIN_OTP = env("ADMIN_OTP");
const ADMIN_NEW_PASSWORD = env("ADMIN_NEW_PASSWORD", `e2e-${Date.now()}-Strong-Passphrase`);
const AUDITOR_USER = env("AUDITOR_USER");
const AUDITOR_PASSWORD = env("AUDITOR_PASSWORD");
const SHOTS = env("SCREENSHOT_DIR", "");
const CHROMIUM = env("CHROMIUM", "/usr/bin/chromium");
// The key server's HTTPS certificate comes from its own CA: the browser trusts exactly
// that server key (base64 SHA-256 of its SubjectPublicKeyInfo), as a user who imported
// the CA would, and nothing else.
const TRUST_SPKI = env("TRUST_SPKI", "");
const AGENT_URL = env("AGENT_URL");
const CA_FINGERPRINT = env("CA_FINGERPRINT");
const HOST_GROUP = env("HOST_GROUP");
const HOST = { db1: env("HOST_DB1"), db2: env("HOST_DB2"), web: env("HOST_WEB"), old: env("HOST_OLD") };
const E2E_OUT = env("E2E_OUT");
const DOMAIN_OF = (hostname) => hostname.split(".").slice(1).join(".");
const SPARE_TOKEN = env("SPARE_TOKEN"); // the prefix of an unused enrollment token, to revoke
const KEY = `payments-db-${Date.now().toString(36)}`;
const KMIP_CLIENT = env("KMIP_CLIENT");
const KMIP_REVOKED = env("KMIP_REVOKED");
const APPROVAL_TARGET = env("APPROVAL_TARGET"); // a key whose destruction another person asked for
const TOKEN = `rotation-bot-${Date.now().toString(36)}`;
const DATABASE = `orders-db-${Date.now().toString(36)}`; // connected in the console by the databases test
// How long an action waits for the page: a bound for a hang, not a speed test. The suite
// runs beside a whole other store's tests on two cores, where a dialog can take many
// seconds to come; a test that is wrong still fails, only later.
const TIMEOUT = Number(env("E2E_TIMEOUT_MS", "60000"));

const work = mkdtempSync(join(tmpdir(), "strongroom-e2e-"));
const STATE = join(work, "admin-state.json");
let browser;
const consoleErrors = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
           ...(TRUST_SPKI ? [`--ignore-certificate-errors-spki-list=${TRUST_SPKI}`] : [])],
  });
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  rmSync(work, { recursive: true, force: true });
});

/** A page that records console errors and uncaught exceptions (a test fails on any). */
async function open(storageState, { allow = [], colorScheme = "light" } = {}) {
  const context = await browser.newContext({ storageState, viewport: { width: 1400, height: 900 }, baseURL: BASE_URL,
                                             colorScheme });
  context.setDefaultTimeout(TIMEOUT);
  const page = await context.newPage();
  const errors = [];
  page.on("console", (m) => {
    if (m.type() === "error" && !allow.some((re) => re.test(m.text()))) errors.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  return { context, page, errors, done: async () => { await context.close(); consoleErrors.push(...errors); assert.deepEqual(errors, []); } };
}

async function shot(page, name) {
  if (!SHOTS) return;
  await page.waitForLoadState("networkidle");
  await page.waitForTimeout(250); // let transitions and charts settle
  await page.addStyleTag({ content: ".mantine-Notifications-root { display: none !important; }" });
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: false });
}

// axe-core, evaluated in the page through the DevTools protocol (the console's CSP allows
// no injected script tags, and must not be loosened for a test).
const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** Serious and critical WCAG 2.x A/AA violations on the page as it is now. */
async function axeViolations(page) {
  await page.waitForLoadState("networkidle");
  await page.waitForTimeout(300); // transitions end: axe reads the colours as painted
  await page.evaluate(AXE);
  const found = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] },
                                        resultTypes: ["violations"] });
    return r.violations.filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 4).map((n) => `${n.target.join(" ")} — ${n.failureSummary?.split("\n").slice(1, 2).join("")}`).join(" | ")}`);
  });
  return found;
}

/** How far the page reaches past the window's right edge (> 0: it scrolls sideways), and
 *  the outermost elements that do, outside any scroll box of their own. */
async function overflowOf(page) {
  return page.evaluate(() => {
    const w = window.innerWidth;
    const out = [...document.querySelectorAll("body *")].filter((el) => {
      if (el.getBoundingClientRect().right <= w + 0.5) return false;
      for (let p = el.parentElement; p; p = p.parentElement) {
        if (getComputedStyle(p).overflowX !== "visible") return false;
        if (p.getBoundingClientRect().right > w + 0.5) return false;
      }
      return true;
    }).map((el) => `${el.tagName}.${String(el.className).slice(0, 80)} "${(el.textContent ?? "").slice(0, 40)}"`);
    return [document.documentElement.scrollWidth - w, out.slice(0, 5)];
  });
}

/** What the dialogs open on, made for one run (`tag` keeps the runs apart): an active key of
 *  the caller's own and a query finding it, an API token and an unused enrollment token. */
async function dialogFixture(context, tag) {
  tag = `${tag}-${Date.now().toString(36)}`; // the names are free even where a run went before
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const post = async (path, data) => {
    const r = await context.request.post(path, { data, headers: { "X-CSRF-Token": csrf } });
    assert.ok(r.ok(), `${path}: ${r.status()} ${await r.text()}`);
    return r.json();
  };
  const key = `dlg-${tag}`;
  await post("/api/v1/keys", { name: key });
  await post(`/api/v1/keys/${key}/rotate`); // v1, older: its inventory and retirement are offered
  const token = `dlg-token-${tag}`;
  await post("/api/v1/tokens", { name: token, expires_in_days: 1 });
  const enrollment = await post("/api/v1/enrollment-tokens", { host_group: `dlg-${tag}`, max_uses: 1 });
  const database = `dlg-${tag}`;
  await post("/api/v1/databases", { name: database });
  await post(`/api/v1/databases/${database}/grants`, { key, key_id: 1 });
  await post("/api/v1/kmip/grants", { grantee: `client:${KMIP_CLIENT}`, key, rights: ["read"] });
  const xks = `dlg-${tag}`; // an AWS key store with the key granted and a credential re-issued (so one to retire)
  await post("/api/v1/xks/stores", { name: xks, region: "eu-west-1" });
  await post(`/api/v1/xks/stores/${xks}/keys`, { key });
  await post(`/api/v1/xks/stores/${xks}/credential`);
  return { tag, key, token, database, xks, enrollPrefix: enrollment.secret.split("_").slice(0, 2).join("_") };
}

const volumePage = (name) => async (p) => {
  await p.getByTestId("volumes-table").locator(`tr[data-volume="${name}"]`).filter({ hasText: HOST.db1 })
    .getByRole("link", { name }).click();
  await p.getByRole("heading", { name, level: 1 }).waitFor();
};
const userMenu = (user, item) => async (p) => {
  await p.getByRole("button", { name: `Actions for ${user}` }).click();
  await p.getByRole("menuitem", { name: item }).click();
};

/** Every dialog and drawer of the console: each <Modal>, <Drawer>, <TypedConfirmDialog> and
 *  <SecretOnce> in webui/src, by the file (`src`) that places it; tests/webui/test_dialogs_listed.py
 *  fails when a file has one more than is listed here. Each is opened from its page without
 *  acting in it, or, where it shows a result (a secret shown once), by doing what shows it.
 *  `close` is for a dialog without a × (it must be dismissed by its own button). */
const dialogs = (f) => [
  { src: "Keys.tsx", name: "Create key", path: "/keys", open: (p) => p.getByTestId("create-key").click() },
  { src: "Keys.tsx", name: /^Rotate \d+ keys$/, path: `/keys?q=${f.key}`, open: async (p) => {
    await p.getByRole("checkbox", { name: "Select every key on this page" }).check();
    await p.getByTestId("bulk-rotate").click();
  } },
  { src: "KeyDetail.tsx", name: `Edit ${f.key}`, path: `/keys/${f.key}`, open: (p) => p.getByTestId("edit-key").click() },
  { src: "KeyDetail.tsx", name: "Rotation schedule", path: `/keys/${f.key}`, open: (p) => p.getByTestId("edit-schedule").click() },
  { src: "KeyDetail.tsx", name: `Deactivate ${f.key}`, path: `/keys/${f.key}`, open: (p) => p.getByRole("button", { name: "Deactivate" }).click() },
  { src: "KeyDetail.tsx", name: `Revoke ${f.key}`, path: `/keys/${f.key}`, open: (p) => p.getByTestId("revoke-key").click() },
  { src: "KeyDetail.tsx", name: `Destroy ${f.key}`, path: `/keys/${f.key}`, open: (p) => p.getByTestId("destroy-key").click() },
  { src: "KeyRetirement.tsx", name: `Inventory of ${f.key} v1`, path: `/keys/${f.key}`,
    open: (p) => p.getByRole("button", { name: "Inventory of v1" }).click() },
  { src: "KeyRetirement.tsx", name: `Retire ${f.key} v1`, path: `/keys/${f.key}`,
    open: (p) => p.getByRole("button", { name: "Retire v1…" }).click() },
  { src: "EnrollHost.tsx", name: "Enroll a host", path: "/hosts", open: (p) => p.getByTestId("enroll-host").click() },
  { src: "Hosts.tsx", name: `Revoke enrollment token ${f.enrollPrefix}…`, path: "/hosts",
    open: (p) => p.getByRole("button", { name: `Revoke enrollment token ${f.enrollPrefix}` }).click() },
  { src: "HostDetail.tsx", name: `Revoke ${HOST.db2}`, path: `/hosts?q=${HOST.db2}`, open: async (p) => {
    await p.getByTestId("hosts-table").getByRole("link", { name: HOST.db2 }).click();
    await p.getByTestId("revoke-host").click();
  } },
  { src: "GuardPoints.tsx", name: "New guard point", path: "/guard-points",
    open: (p) => p.getByRole("button", { name: "New guard point" }).click() },
  { src: "GuardPoints.tsx", name: /^Delete \//, path: "/guard-points",
    open: (p) => p.getByRole("button", { name: /^Delete \// }).first().click() },
  { src: "Volumes.tsx", name: "Re-key volume pg-data", path: "/volumes",
    open: async (p) => { await volumePage("pg-data")(p); await p.getByTestId("volume-rekey").click(); } },
  { src: "Volumes.tsx", name: "Revoke volume pg-data", path: "/volumes",
    open: async (p) => { await volumePage("pg-data")(p); await p.getByTestId("volume-revoke").click(); } },
  { src: "Audit.tsx", name: "Audit chain verification", path: "/audit", open: (p) => p.getByTestId("verify-chain").click() },
  { src: "Audit.tsx", name: /^Audit record #\d+/, path: "/audit",
    open: (p) => p.getByRole("button", { name: /^Open audit record \d+/ }).first().click() },
  { src: "Users.tsx", name: "Create user", path: "/users", open: (p) => p.getByTestId("create-user").click() },
  { src: "Users.tsx", name: `Make ${AUDITOR_USER} operator`, path: "/users", open: userMenu(AUDITOR_USER, "Make operator…") },
  { src: "Users.tsx", name: `Reset the password of ${AUDITOR_USER}`, path: "/users",
    open: userMenu(AUDITOR_USER, "Reset password…") },
  { src: "Users.tsx", name: `Disable ${AUDITOR_USER}`, path: "/users", open: userMenu(AUDITOR_USER, "Disable…") },
  { src: "Users.tsx", name: "One-time password", path: "/users", open: async (p) => {
    await p.getByTestId("create-user").click();
    const create = p.getByRole("dialog", { name: "Create user" });
    await create.getByLabel("Username").fill(`dlg-${f.tag}-${Date.now().toString(36)}`);
    await create.getByRole("button", { name: "Create user" }).click();
  } },
  { src: "Tokens.tsx", name: "Create API token", path: "/tokens", open: (p) => p.getByTestId("create-token").click() },
  { src: "Tokens.tsx", name: `Revoke ${f.token}`, path: "/tokens",
    open: (p) => p.getByRole("button", { name: `Revoke token ${f.token}` }).click() },
  { src: "Tokens.tsx", name: "API token created", path: "/tokens", open: async (p) => {
    await p.getByTestId("create-token").click();
    const create = p.getByRole("dialog", { name: "Create API token" });
    await create.getByLabel("Name").fill(`dlg-made-${f.tag}-${Date.now().toString(36)}`);
    await create.getByRole("button", { name: "Create token" }).click();
  } },
  { src: "System.tsx", name: "Rotate the KEK", path: "/system", open: (p) => p.getByTestId("rotate-kek").click() },
  { src: "Kmip.tsx", name: "Create KMIP client", path: "/kmip-clients", open: (p) => p.getByTestId("create-kmip-client").click() },
  { src: "Kmip.tsx", name: `Revoke ${KMIP_CLIENT}`, path: "/kmip-clients",
    open: (p) => p.getByRole("button", { name: `Revoke KMIP client ${KMIP_CLIENT}` }).click() },
  { src: "Kmip.tsx", name: `Key export of ${KMIP_CLIENT}`, path: "/kmip-clients",
    open: (p) => p.getByRole("button", { name: `Change key export of ${KMIP_CLIENT}` }).click() },
  { src: "Kmip.tsx", name: `Group of ${KMIP_CLIENT}`, path: "/kmip-clients",
    open: (p) => p.getByRole("button", { name: `Change group of ${KMIP_CLIENT}` }).click() },
  { src: "KmipAccess.tsx", name: "Grant KMIP access", path: "/kmip-clients?view=grants", open: (p) => p.getByTestId("grant-kmip-access").click() },
  { src: "KmipAccess.tsx", name: `Revoke the grant of ${f.key} to ${KMIP_CLIENT}`, path: "/kmip-clients?view=grants",
    open: (p) => p.getByRole("button", { name: `Revoke the grant of ${f.key} to ${KMIP_CLIENT}` }).click() },
  { src: "Kmip.tsx", name: "KMIP client created", path: "/kmip-clients", close: (p) => p.getByTestId("kmip-issued-done").click(),
    open: async (p) => {
      await p.getByTestId("create-kmip-client").click();
      const form = p.getByRole("form", { name: "Create KMIP client" });
      await form.getByRole("textbox", { name: /Name/ }).fill(`dlg-${f.tag}-${Date.now().toString(36)}.${DOMAIN_OF(HOST.db1)}`);
      await form.getByTestId("create-kmip-client-submit").click();
    } },
  { src: "Databases.tsx", name: "Connect a database", path: "/databases", open: (p) => p.getByTestId("connect-database").click() },
  { src: "Databases.tsx", name: /^dlg-.* connected$/, path: "/databases", close: (p) => p.getByTestId("database-token-done").click(),
    open: async (p) => {
      await p.getByTestId("connect-database").click();
      const form = p.getByRole("form", { name: "Connect a database" });
      await form.getByRole("textbox", { name: /Name/ }).fill(`dlg-${f.tag}-${Date.now().toString(36)}`);
      await form.getByTestId("connect-database-submit").click();
    } },
  { src: "DatabaseDetail.tsx", name: `Grant a key to ${f.database}`, path: `/databases/${f.database}`,
    open: (p) => p.getByTestId("grant-key").click() },
  { src: "DatabaseDetail.tsx", name: `Remove key id 1 from ${f.database}`, path: `/databases/${f.database}`,
    open: (p) => p.getByRole("button", { name: `Remove key id 1 (${f.key}) from ${f.database}` }).click() },
  { src: "DatabaseDetail.tsx", name: `Issue a new token for ${f.database}`, path: `/databases/${f.database}`,
    open: (p) => p.getByTestId("reissue-token").click() },
  { src: "DatabaseDetail.tsx", name: `Revoke ${f.database}`, path: `/databases/${f.database}`,
    open: (p) => p.getByTestId("revoke-database").click() },
  { src: "XksStores.tsx", name: "Connect a key store", path: "/aws-key-stores", open: (p) => p.getByTestId("connect-xks").click() },
  { src: "XksStores.tsx", name: /^xks-dlg-.* connected$/, path: "/aws-key-stores", close: (p) => p.getByTestId("xks-credential-done").click(),
    open: async (p) => {
      await p.getByTestId("connect-xks").click();
      const form = p.getByRole("form", { name: "Connect a key store" });
      await form.getByRole("textbox", { name: /^Name/ }).fill(`xks-dlg-${f.tag}-${Date.now().toString(36)}`);
      await form.getByRole("textbox", { name: /AWS region/ }).fill("eu-west-1");
      await form.getByTestId("connect-xks-submit").click();
    } },
  { src: "XksStoreDetail.tsx", name: `Grant a key to ${f.xks}`, path: `/aws-key-stores/${f.xks}`, open: (p) => p.getByTestId("xks-grant-key").click() },
  { src: "XksStoreDetail.tsx", name: `Remove ${f.key} from ${f.xks}`, path: `/aws-key-stores/${f.xks}`,
    open: (p) => p.getByRole("button", { name: `Remove ${f.key} (${f.key}) from ${f.xks}` }).click() },
  { src: "XksStoreDetail.tsx", name: `Issue a new credential for ${f.xks}`, path: `/aws-key-stores/${f.xks}`,
    open: (p) => p.getByTestId("rotate-xks-credential").click() },
  { src: "XksStoreDetail.tsx", name: `Retire the previous credential of ${f.xks}`, path: `/aws-key-stores/${f.xks}`,
    open: (p) => p.getByTestId("retire-xks-previous").click() },
  { src: "XksStoreDetail.tsx", name: `Mutual TLS for ${f.xks}`, path: `/aws-key-stores/${f.xks}`, open: (p) => p.getByTestId("xks-mtls-change").click() },
  { src: "XksStoreDetail.tsx", name: `Revoke ${f.xks}`, path: `/aws-key-stores/${f.xks}`, open: (p) => p.getByTestId("revoke-xks").click() },
  { src: "Approvals.tsx", name: "Approve: Destroy a key", path: "/approvals",
    open: (p) => p.getByRole("button", { name: `Approve: Destroy a key, ${APPROVAL_TARGET}` }).click() },
  { src: "GlobalSearch.tsx", name: "Search", path: "/", open: (p) => p.keyboard.press("Control+K") },
];

/** Open each dialog in turn, run check(name, dialog) while it is open, close it by its × (found
 *  by its name) or, without one, by its own button. */
async function withEachDialog(page, fixture, check) {
  // The fixture was made through the API after this page had read lists (the tokens on /hosts,
  // say) that the console keeps fresh for 15 s: a new document starts with none of them cached.
  await page.goto("/#/");
  await page.reload();
  for (const d of dialogs(fixture)) {
    await page.goto(`/#${d.path}`);
    await page.locator("#main-content h1").first().waitFor();
    await page.waitForLoadState("networkidle");
    await d.open(page);
    const dialog = page.getByRole("dialog", { name: d.name });
    await dialog.waitFor();
    // A drawer slides in, a modal pops: judge it where it comes to rest.
    const close = d.close ? null : dialog.getByRole("button", { name: /^Close (dialog|panel)$/ });
    let last = null;
    await until(async () => {
      const box = await (close ?? dialog).boundingBox();
      const still = box !== null && last !== null && box.x === last.x && box.y === last.y;
      last = box;
      return still;
    }, () => `${d.name}: it never came to rest`);
    await check(String(d.name), dialog, close);
    await (close ? close.click() : d.close(page));
    await dialog.waitFor({ state: "detached" });
  }
}

/** Poll until cond() holds (the page re-renders as data arrives). */
async function until(cond, message, timeout = TIMEOUT) {
  const end = Date.now() + timeout;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(message());
}

/** RFC 6238's code for a base32 key at time t (SHA-1, 30 s, 6 digits), as an authenticator app makes it. */
function totp(key, t = Date.now()) {
  const bits = [...key.replace(/=+$/, "")].map((c) => "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".indexOf(c).toString(2).padStart(5, "0")).join("");
  const secret = Buffer.from(bits.match(/.{8}/g).map((b) => parseInt(b, 2)));
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(Math.floor(t / 30_000)));
  const h = createHmac("sha1", secret).update(counter).digest();
  return String((h.readUInt32BE(h[h.length - 1] & 15) & 0x7fffffff) % 1_000_000).padStart(6, "0");
}

async function signIn(page, user, password) {
  await page.goto("/#/sign-in");
  await page.getByLabel("Username").fill(user);
  await page.locator('input[name="password"]').fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
}

/** A first sign-in with the one-time password: the console asks for a new one, then shows the dashboard. */
async function firstSignIn(page, user, otp, password) {
  await signIn(page, user, otp);
  await page.waitForURL(/#\/change-password/);
  await page.locator('input[name="current_password"]').fill(otp);
  await page.locator('input[name="new_password"]').fill(password);
  await page.locator('input[name="new_password_again"]').fill(password);
  await page.getByRole("button", { name: "Save password" }).click();
  await page.getByRole("heading", { name: "Dashboard" }).waitFor();
}

test("sign in with the one-time password, forced to choose a new one; state stored", async () => {
  const { page, context, done } = await open(undefined);
  await page.goto("/");
  await page.waitForURL(/#\/sign-in/);
  await page.getByRole("heading", { name: "Sign in" }).waitFor();
  await shot(page, "sign-in");
  await firstSignIn(page, ADMIN_USER, ADMIN_OTP, ADMIN_NEW_PASSWORD);
  assert.equal(await page.getByTestId("whoami").textContent(), ADMIN_USER);
  await context.storageState({ path: STATE });
  await done();
});

test("a wrong password is refused with an actionable message", async () => {
  // The browser logs the 401 of the refused sign-in itself: that one is expected.
  const { page, done } = await open(undefined, { allow: [/status of 401/] });
  await signIn(page, "nobody-here", "not-the-password");
  const error = page.getByTestId("api-error");
  await error.getByText("bad_credentials").waitFor();
  await error.getByText(/Check the username and password/).waitFor();
  await done();
});

test("dashboard shows keys by state, rotations due, denied accesses and the audit chain", async () => {
  const { page, done } = await open(STATE);
  await page.goto("/");
  await page.getByRole("heading", { name: "Keys by state" }).waitFor();
  await page.getByRole("heading", { name: "Recent denied accesses" }).waitFor();
  // The audit panel reads the chain's status (last checkpoint, last verification) and
  // verifies only when asked.
  await page.getByTestId("chain-status").getByText(/Last checkpoint/).waitFor();
  await page.getByRole("button", { name: "Verify now" }).click();
  await page.getByTestId("verify-result").waitFor();
  assert.equal(await page.getByTestId("verify-result").getAttribute("data-ok"), "true");
  await page.getByRole("heading", { name: "Hosts", exact: true }).waitFor();
  await page.getByTestId("hosts-online").waitFor();
  assert.ok(Number(await page.getByTestId("hosts-online").getAttribute("data-count")) >= 2, "two hosts are online");
  // web-01 never sent a heartbeat (other test suites' hosts may be offline too, and the
  // panel lists only a few: count, do not look for the name).
  assert.ok(Number(await page.getByTestId("hosts-offline").getAttribute("data-count")) >= 1, "a host is offline");
  await page.getByTestId("hosts-attention").getByText(/never sent a heartbeat|no heartbeat for/).first().waitFor();
  await done();
});

test("enroll a host: create an enrollment token and read the one-liner", async () => {
  const { page, context, done } = await open(STATE);
  await page.goto("/#/hosts");
  await page.getByRole("heading", { name: "Hosts", exact: true }).waitFor();
  await page.getByTestId("enroll-host").click();
  const dialog = page.getByRole("dialog", { name: "Enroll a host" });
  await dialog.getByRole("textbox", { name: /Host group/ }).fill(HOST_GROUP);
  await dialog.getByTestId("group-keys").getByText(/2 keys/).waitFor(); // the group's keys, counted
  await dialog.getByLabel("Uses").fill("3");
  await dialog.getByTestId("create-enrollment-token").click();

  const secret = (await dialog.getByTestId("enrollment-secret").textContent()) ?? "";
  assert.match(secret, /^sre_[a-z2-7]+_[A-Za-z0-9_-]{20,}$/);
  const command = await dialog.getByTestId("install-command").textContent();
  assert.ok(command?.includes(`--token ${secret}`), `the one-liner carries the token: ${command}`);
  assert.ok(command?.includes(`${AGENT_URL}/install.sh`), `the one-liner names the install URL: ${command}`);
  assert.equal(command, `curl -fsS --cacert ca.pem ${AGENT_URL}/install.sh | sh -s -- --token ${secret}`); // root or sudo: the installer decides
  assert.equal(await dialog.getByTestId("ca-fingerprint").textContent(), CA_FINGERPRINT);
  await dialog.getByText("shown only once", { exact: false }).waitFor();
  // What the dialog points at is real: the CA download is the certificate whose
  // fingerprint it shows, and the installer behind the one-liner is served.
  assert.equal(await dialog.getByTestId("download-ca").getAttribute("href"), "/ca.pem");
  const [download] = await Promise.all([page.waitForEvent("download"), dialog.getByTestId("download-ca").click()]);
  const pem = readFileSync(await download.path(), "utf8");
  assert.equal(new X509Certificate(pem).fingerprint256, CA_FINGERPRINT);
  // Saved under the name the one-liner uses (the server's content-disposition decides).
  assert.equal(download.suggestedFilename(), "ca.pem");
  const installer = await context.request.get(`${AGENT_URL}/install.sh`, { ignoreHTTPSErrors: true });
  assert.equal(installer.status(), 200);
  assert.ok((await installer.text()).includes(`SERVER_URL='${AGENT_URL}'`));
  writeFileSync(join(E2E_OUT, "enrollment-token.txt"), secret); // the Python side enrolls a host with it
  await shot(page, "enroll");

  await dialog.getByRole("button", { name: "I have copied it" }).click();
  await dialog.waitFor({ state: "detached" });
  const prefix = secret.split("_").slice(0, 2).join("_");
  const row = page.getByTestId("enrollment-tokens-table").locator(`tr[data-token="${prefix}"]`);
  await row.getByText("0 / 3").waitFor();
  assert.equal(await row.locator("[data-state]").textContent(), "active");

  // Revoke another, unused token: after a confirmation, it leaves the active list.
  const tokens = page.getByTestId("enrollment-tokens-table");
  const spare = tokens.locator(`tr[data-token="${SPARE_TOKEN}"]`);
  await spare.getByRole("button", { name: `Revoke enrollment token ${SPARE_TOKEN}` }).click();
  const confirm = page.getByRole("dialog", { name: `Revoke enrollment token ${SPARE_TOKEN}…` });
  await confirm.getByText(/Hosts that already enrolled with it keep working/).waitFor();
  await confirm.getByRole("button", { name: "Revoke token" }).click();
  await confirm.waitFor({ state: "detached" });
  await spare.waitFor({ state: "detached" });
  // The switch, by keyboard (its input is visually hidden, as a switch's is).
  await page.getByRole("switch", { name: /Show used, expired and revoked/ }).focus();
  await page.keyboard.press("Space");
  await until(async () => (await spare.locator("[data-state]").textContent().catch(() => null)) === "revoked",
              () => "the revoked token is listed as revoked");
  await done();
});

test("hosts: status in the list, a host's detail, revoke with its hostname typed", async () => {
  const { page, done } = await open(STATE);
  await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`); // this run's hosts, whatever else the store holds
  const table = page.getByTestId("hosts-table");
  const row = (name) => table.locator(`tr[data-host="${name}"]`);
  const status = (name) => row(name).locator("[data-status]").textContent();
  await row(HOST.db1).waitFor();
  assert.equal(await status(HOST.db1), "Online");
  assert.equal(await status(HOST.db2), "Online");
  assert.equal(await status(HOST.web), "Offline");
  await row(HOST.web).getByText("never (awaiting the first)").waitFor();
  await row(HOST.db2).getByText("1 in error").waitFor();

  // Revoke one: the hostname must be typed exactly.
  await row(HOST.old).getByRole("link", { name: HOST.old }).click();
  await page.getByTestId("host-name").getByText(HOST.old).waitFor();
  await page.getByTestId("revoke-host").click();
  const dialog = page.getByRole("dialog", { name: `Revoke ${HOST.old}` });
  await dialog.getByText(/drops every key it has cached/).waitFor();
  const submit = dialog.getByTestId("typed-confirm-submit");
  await dialog.getByTestId("typed-confirm-input").fill(HOST.old.slice(0, -1));
  assert.equal(await submit.isDisabled(), true);
  await dialog.getByTestId("typed-confirm-input").fill(HOST.old);
  await submit.click();
  await page.getByTestId("host-revoked").waitFor();
  assert.equal(await page.getByTestId("revoke-host").count(), 0);
  await page.getByTestId("host-events").getByText("host.revoke").waitFor();

  // The list filters by status and group.
  await page.goto(`/#/hosts?status=revoked&q=${DOMAIN_OF(HOST.db1)}`); // on the first page, whatever else was revoked
  await row(HOST.old).waitFor();
  assert.equal(await status(HOST.old), "Revoked");
  assert.equal(await row(HOST.db1).count(), 0);
  await page.goto(`/#/hosts?group=${HOST_GROUP}&status=online`);
  await row(HOST.db1).waitFor();
  assert.equal(await row(HOST.web).count(), 0);

  // A host's detail: identity, guard points as reported, its group's keys, its activity.
  await row(HOST.db2).getByRole("link", { name: HOST.db2 }).click();
  await page.getByTestId("host-name").getByText(HOST.db2).waitFor();
  const identity = page.getByTestId("host-identity");
  await identity.getByText(HOST_GROUP).waitFor();
  await identity.getByText("127.0.0.1").waitFor();
  const gps = page.getByTestId("guard-points");
  await gps.getByText("/srv/postgresql/16/main").waitFor();
  assert.equal(await gps.locator('[data-state="error"]').count(), 1);
  const keys = page.getByTestId("host-keys");
  await keys.getByRole("link", { name: "pg-main" }).waitFor();
  await keys.getByRole("link", { name: "pg-wal" }).waitFor();
  const events = page.getByTestId("host-events");
  await events.getByText("agent.access.denied").waitFor(); // reported by the host itself
  await events.getByText("host.enroll").waitFor();
  await shot(page, "host-detail");

  // The host that fetched its key: heard from this hour, its use of the key drawn.
  await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`); // this run's hosts, whatever else the store holds
  await row(HOST.db1).getByRole("link", { name: HOST.db1 }).click();
  const beats = page.getByTestId("heartbeat-timeline");
  await beats.waitFor();
  assert.ok(Number(await beats.getAttribute("data-heard")) >= 1, "the current hour shows its heartbeats");
  const used = page.getByTestId("usage-chart");
  await used.getByTestId("usage-top").getByRole("link", { name: "pg-main" }).waitFor();
  assert.match(await used.getByRole("img", { name: /^Operations per/ }).getAttribute("aria-label"), /\d+ key\.deliver/);
  await beats.scrollIntoViewIfNeeded();
  await shot(page, "host-activity");
  // Its guard points over time, from the agent's own audit records: the crash is on it.
  const states = page.getByTestId("guard-point-timeline");
  const main = states.locator('[data-path="/srv/postgresql/16/main"]');
  assert.equal(await main.getAttribute("data-states"), "unknown mounted crashed mounted");
  assert.equal(await states.locator('[data-path="/srv/postgresql/wal"]').getAttribute("data-states"), "mounted");
  await states.getByTestId("guard-point-changes").getByText("stopped on a crash (status 139)").waitFor();
  await states.scrollIntoViewIfNeeded();
  await shot(page, "guard-point-timeline");

  // The console's one search box, from the keyboard: a host by part of its name, then the
  // audit log's records holding a key's name.
  await page.goto("/#/");
  await page.getByTestId("chain-status").waitFor();
  await page.keyboard.press("Control+k");
  const search = page.getByTestId("global-search-input");
  await search.fill(HOST.db2.split(".")[0]);
  await page.getByRole("option", { name: `Hosts: ${HOST.db2} (${HOST_GROUP})` }).waitFor();
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: HOST.db2 }).waitFor();
  await page.getByTestId("global-search-open").click();
  await search.fill("pg-main");
  await page.getByRole("option", { name: /^Keys: pg-main/ }).waitFor();
  await page.getByRole("option", { name: /^Audit log: Records holding/ }).click();
  await page.waitForURL(/#\/audit\?q=pg-main/);
  await page.getByTestId("audit-table").getByText("key.deliver").first().waitFor();

  // Search and sort on the server: this run's hosts, latest heartbeat first; the host
  // never heard from comes last either way.
  await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`);
  await row(HOST.db1).waitFor();
  await page.getByRole("button", { name: "Sort by last heartbeat" }).click();
  await page.getByRole("button", { name: "Sort by last heartbeat" }).click();
  await page.waitForURL(/sort=-last_heartbeat_at/);
  await until(async () => (await table.locator("tbody tr").last().getAttribute("data-host")) === HOST.web
    && (await page.getByRole("columnheader", { name: /last heartbeat/i }).getAttribute("aria-sort")) === "descending",
    () => "the never-seen host is last, sorted by latest heartbeat");

  await page.getByRole("link", { name: "Hosts", exact: true }).first().click();
  await row(HOST.db1).waitFor();
  await shot(page, "hosts");
  await done();
});

test("create a key, see it in the list, rotate it", async () => {
  const { page, context, done } = await open(STATE);
  // A few more keys, through the API with this session, so the dashboard has something to show.
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const more = [
    { name: `${KEY}-backup`, rotation_period_days: 7, tags: { env: "dr" } },
    { name: `${KEY}-staging`, activate: false, tags: { env: "staging" } },
    { name: `${KEY}-archive`, description: "retired archive key" },
  ];
  for (const body of more) {
    const r = await context.request.post("/api/v1/keys", { data: body, headers: { "X-CSRF-Token": csrf } });
    assert.equal(r.status(), 201, await r.text());
  }
  const r = await context.request.post(`/api/v1/keys/${KEY}-archive/deactivate`, { headers: { "X-CSRF-Token": csrf } });
  assert.equal(r.status(), 200, await r.text());
  await page.goto("/#/keys");
  await page.getByRole("heading", { name: "Keys", exact: true }).waitFor();
  await page.getByTestId("create-key").click();
  const dialog = page.getByRole("dialog", { name: "Create key" });
  await dialog.getByLabel("Name").fill(KEY);
  await dialog.getByLabel("Description").fill("Card payments database (TDE)");
  await dialog.getByLabel("Tags").fill("env=prod");
  await dialog.getByLabel("Tags").press("Enter");
  await dialog.getByLabel("Rotation period (days)").fill("90");
  await dialog.getByRole("button", { name: "Create key" }).click();
  await page.waitForURL(new RegExp(`#/keys/${KEY}`));
  await page.getByTestId("key-name").getByText(KEY).waitFor();
  await page.getByTestId("version-timeline").getByText("v1").waitFor();

  // The list: search and filter find it.
  await page.goto(`/#/keys?q=${KEY}&state=active&tag=env%3Dprod`);
  await page.getByTestId("keys-table").getByRole("link", { name: KEY, exact: true }).waitFor();
  await until(async () => (await page.getByTestId("keys-table").locator("tbody tr").count()) === 1,
              () => "state + tag filters leave the one key");
  await page.goto(`/#/keys?q=${KEY}`);
  await page.getByTestId("keys-table").getByRole("link", { name: `${KEY}-archive` }).waitFor();
  await until(async () => (await page.getByTestId("keys-table").locator("tbody tr").count()) === 4,
              () => "the search finds the four keys of this run");
  await shot(page, "keys");

  await page.getByTestId("keys-table").getByRole("link", { name: KEY, exact: true }).click();
  await page.getByTestId("rotate-key").click();
  const timeline = page.getByTestId("version-timeline");
  await timeline.getByText("v2").waitFor();
  assert.equal(await timeline.locator('[data-state="active"]').count(), 1);
  assert.equal(await timeline.locator('[data-state="deactivated"]').count(), 1);
  await page.getByTestId("key-usage").getByText("key.rotate").first().waitFor();
  await shot(page, "key-detail");
  // Its use over time: what was done to it and by whom (counted as the chain grows).
  await until(async () => {
    await page.reload();
    const chart = page.getByTestId("usage-chart");
    await chart.or(page.getByText("No use in the last 24 hours")).waitFor();
    return (await chart.count()) === 1 && /key\.rotate/.test(await chart.getByRole("img", { name: /^Operations per/ }).getAttribute("aria-label"));
  }, () => "the key's usage chart shows its rotation");
  await page.getByTestId("usage-chart").scrollIntoViewIfNeeded();
  await shot(page, "key-usage");
  // Try it: encrypt in the HSM, then decrypt the envelope handed out (after a rotation, by
  // the version that encrypted).
  const secret = `card 4242 4242 4242 4242 — ${Date.now()}`;
  const trying = page.getByTestId("key-crypto");
  await trying.getByRole("textbox", { name: "Plaintext" }).fill(secret);
  await trying.getByTestId("encrypt-submit").click();
  const envelope = await trying.getByTestId("encrypt-envelope").textContent();
  assert.equal(JSON.parse(envelope).v, 2);
  await trying.scrollIntoViewIfNeeded();
  await shot(page, "key-try");
  await page.getByTestId("rotate-key").click();
  await timeline.getByText("v3").waitFor();
  await trying.getByRole("tab", { name: "Decrypt" }).click();
  await trying.getByRole("textbox", { name: "Envelope" }).fill(envelope);
  await trying.getByTestId("decrypt-submit").click();
  assert.equal(await trying.getByTestId("decrypt-plaintext").textContent(), secret);

  await page.goto("/");
  await page.getByTestId("chain-status").waitFor();
  await until(async () => (await page.getByTestId("keys-total").textContent()) !== "0 keys", () => "keys total");
  await page.getByRole("heading", { name: /Rotations due/ }).waitFor();
  await page.getByTestId("hosts-online").waitFor();
  await page.getByRole("status").first().waitFor({ state: "detached" }); // every panel loaded
  await shot(page, "dashboard");
  await done();
});

test("destroy needs the key's name typed exactly", async () => {
  const { page, done } = await open(STATE);
  await page.goto(`/#/keys/${KEY}`);
  await page.getByTestId("destroy-key").click();
  const submit = page.getByTestId("typed-confirm-submit");
  assert.equal(await submit.isDisabled(), true);
  await page.getByTestId("typed-confirm-input").fill(KEY.slice(0, -1));
  assert.equal(await submit.isDisabled(), true);
  await page.getByRole("button", { name: "Cancel" }).click();
  await done();
});

test("retire an older version: its inventory, the retirement, the signed statement, then destroy; a version in use is refused and shredded only by name", async () => {
  // Destroy's refusal of a version in use is a 409 the browser logs: expected here.
  const { page, context, done } = await open(STATE, { allow: [/status of 409/] });
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const post = async (path, data) => {
    const r = await context.request.post(path, { data, headers: { "X-CSRF-Token": csrf } });
    assert.ok(r.ok(), `${path}: ${r.status()} ${await r.text()}`);
    return r.json();
  };
  const retired = `${KEY}-retired`, shredded = `${KEY}-shredded`;
  for (const name of [retired, shredded]) await post("/api/v1/keys", { name });
  // A data key issued under v1 of one of them: v1 is in use until it is re-encrypted.
  await post(`/api/v1/keys/${shredded}/generate-data-key`, { number_of_bytes: 32 });
  for (const name of [retired, shredded]) await post(`/api/v1/keys/${name}/rotate`);
  await until(async () => {
    const r = await context.request.get(`/api/v1/keys/${shredded}/versions/1/inventory`);
    return r.ok() && (await r.json()).in_use === true;
  }, () => `the chainer never counted the data key issued under ${shredded} v1`, 60_000);

  // Nothing uses v1: its inventory says so; retiring it ends in a signed statement.
  await page.goto(`/#/keys/${retired}`);
  await page.getByRole("button", { name: "Inventory of v1" }).click();
  let drawer = page.getByRole("dialog", { name: `Inventory of ${retired} v1` });
  await drawer.getByTestId("inventory-summary").getByText("Nothing uses v1").waitFor();
  await drawer.getByTestId("inventory-retire").click();
  const retire = page.getByRole("dialog", { name: `Retire ${retired} v1` });
  assert.equal(await retire.getByTestId("retire-submit").isDisabled(), true, "a reason is required");
  await retire.getByTestId("retire-reason").fill("end-to-end: annual key retirement");
  await retire.getByTestId("retire-submit").click();
  await retire.waitFor({ state: "detached" });
  drawer = page.getByRole("dialog", { name: `Inventory of ${retired} v1` }); // opened again on the retirement
  await drawer.getByTestId("retirement").waitFor();
  await until(async () => {
    if ((await drawer.getByTestId("retirement").getAttribute("data-state")) === "complete"
        && (await drawer.getByTestId("statement-link").count()) === 1) return true;
    await drawer.getByRole("button", { name: "Close panel" }).click(); // read the inventory again: it completes there
    await drawer.waitFor({ state: "detached" });
    await page.getByRole("button", { name: "Inventory of v1" }).click();
    await drawer.getByTestId("retirement").waitFor();
    return false;
  }, () => "the retirement never completed with its statement's record", 60_000);
  const seq = (await drawer.getByTestId("statement-link").textContent()).replace("#", "");
  const record = await (await context.request.get(`/api/v1/audit/events/${seq}`)).json();
  assert.equal(record.action, "key.version_retired");
  await drawer.getByRole("button", { name: "Close panel" }).click();
  await drawer.waitFor({ state: "detached" });
  await page.getByTestId("retirement-v1").getByText("retired").waitFor();
  // Then destroy it: the dialog starts on v1, the older version.
  await page.getByTestId("destroy-key").click();
  let destroy = page.getByRole("dialog", { name: `Destroy ${retired}` });
  await destroy.getByTestId("typed-confirm-input").fill(retired);
  await destroy.getByRole("button", { name: "Destroy v1" }).click();
  await destroy.waitFor({ state: "detached" });
  await page.getByTestId("version-timeline").locator('[data-state="destroyed"]').waitFor();

  // v1 in use: destroy is refused with its holders; shredding asks for the name again.
  await page.goto(`/#/keys/${shredded}`);
  await page.getByTestId("destroy-key").click();
  destroy = page.getByRole("dialog", { name: `Destroy ${shredded}` });
  await destroy.getByTestId("typed-confirm-input").fill(shredded);
  await destroy.getByRole("button", { name: "Destroy v1" }).click();
  const refused = destroy.getByTestId("destroy-in-use");
  await refused.getByTestId("destroy-holders").getByText(/Data keys/).waitFor();
  await refused.getByTestId("destroy-retire-v1").waitFor();
  await refused.getByTestId("shred-anyway").click();
  const shred = destroy.getByRole("button", { name: "Shred v1 anyway" });
  assert.equal(await destroy.getByTestId("typed-confirm-input").inputValue(), "", "the name is asked for again");
  assert.equal(await shred.isDisabled(), true);
  await destroy.getByTestId("typed-confirm-input").fill(shredded);
  await shred.click();
  await destroy.waitFor({ state: "detached" });
  await page.getByTestId("version-timeline").locator('[data-state="destroyed"]').waitFor();
  await done();
});

test("audit log: filter, open a record, verify the chain", async () => {
  const { page, done } = await open(STATE);
  await page.goto("/#/audit");
  await page.getByRole("heading", { name: "Audit log" }).waitFor();
  await page.getByLabel("Action").fill("key.rotate");
  await page.getByRole("button", { name: "Apply" }).click();
  await page.waitForURL(/action=key.rotate/);
  const table = page.locator('[data-testid="audit-table"][data-stale="false"]');
  let actions = [];
  await until(async () => {
    actions = await table.locator("tbody tr td:nth-child(4)").allTextContents();
    return actions.length > 0 && actions.every((a) => a === "key.rotate");
  }, () => `audit rows never showed only key.rotate; last seen: ${actions}`);
  await table.locator("tbody tr").first().click();
  const record = page.getByTestId("audit-record");
  await record.getByText("Record hash (HMAC-SHA-256)").waitFor();
  await page.keyboard.press("Escape");
  await record.waitFor({ state: "detached" });

  // Full-text search and a prefix of the actor: what this run's database hosts did.
  await page.getByLabel("Action").fill("");
  await page.getByLabel("Actor").fill("host:pg-0*");
  await page.getByTestId("audit-search").fill("pg* main");
  await page.getByRole("button", { name: "Apply" }).click();
  await page.waitForURL(/q=pg\*\+main/);
  let actors = [];
  await until(async () => {
    actors = await table.locator("tbody tr td:nth-child(3)").allTextContents();
    return actors.length > 0 && actors.every((a) => a.startsWith("host:pg-0"));
  }, () => `the search never showed only this run's database hosts; last seen: ${actors}`);
  assert.ok((await table.locator("tbody tr td:nth-child(4)").allTextContents()).includes("key.deliver"));

  await page.getByLabel("Actor").fill("");
  await page.getByTestId("audit-search").fill("");
  await page.getByRole("button", { name: "Apply" }).click();
  await page.getByTestId("verify-chain").click();
  const result = page.getByTestId("verify-result");
  await result.waitFor();
  assert.equal(await result.getAttribute("data-ok"), "true");
  await page.keyboard.press("Escape");
  await shot(page, "audit");
  const csv = await page.getByTestId("export-csv").getAttribute("href", { timeout: 1000 }).catch(() => null);
  // The menu is closed; the links exist when it is open.
  await page.getByRole("button", { name: "Export" }).click();
  assert.match(await page.getByTestId("export-csv").getAttribute("href"), /\/api\/v1\/audit\/export\?format=csv/);
  assert.ok(csv === null || csv.includes("format=csv"));
  await page.keyboard.press("Escape");
  await done();
});

test("users and API tokens: one-time password and token are shown once", async () => {
  const { page, done } = await open(STATE);
  await page.goto("/#/users");
  await page.getByTestId("users-table").getByText(AUDITOR_USER).waitFor();
  // A new user gets a one-time password, shown once with a copy button.
  const newUser = `e2e-op-${Date.now().toString(36)}`;
  await page.getByTestId("create-user").click();
  const create = page.getByRole("dialog", { name: "Create user" });
  await create.getByLabel("Username").fill(newUser);
  await create.getByRole("button", { name: "Create user" }).click();
  const otp = page.getByRole("dialog", { name: "One-time password" });
  assert.ok(((await otp.getByTestId("secret-value").textContent()) ?? "").length >= 12);
  await otp.getByRole("button", { name: "Copy to clipboard" }).waitFor();
  await otp.getByRole("button", { name: "I have stored it" }).click();
  await page.getByTestId("users-table").getByText(newUser).waitFor();
  await shot(page, "users");
  await page.goto("/#/tokens");
  await page.getByTestId("create-token").click();
  const dialog = page.getByRole("dialog", { name: "Create API token" });
  await dialog.getByLabel("Name").fill(TOKEN);
  await dialog.getByRole("button", { name: "Create token" }).click();
  const secret = await page.getByTestId("secret-value").textContent();
  assert.match(secret ?? "", /^srk_/);
  await page.getByRole("button", { name: "I have stored it" }).click();
  await page.getByTestId("tokens-table").getByText(TOKEN).waitFor();
  await shot(page, "tokens");
  await done();
});

test("guard points: define one with ordered rules in learn mode, then see it listed", async () => {
  const { page, done } = await open(STATE);
  const path = `/srv/e2e-${Date.now().toString(36)}`;
  await page.goto("/#/guard-points");
  await page.getByTestId("new-guard-point").click();
  const form = page.getByRole("form", { name: "Guard point" });
  await form.getByLabel("Host group").fill("e2e-db");
  await form.getByLabel("Protected path").fill(path);
  await form.getByRole("textbox", { name: "Key" }).fill(KEY);
  await page.getByRole("option", { name: KEY, exact: true }).click();
  await page.getByTestId("mode-help").getByText(/would deny/).waitFor();
  await form.getByRole("button", { name: "Add rule" }).click();
  await form.getByText("Rule 1 — deny read and write to everyone").waitFor(); // a blank rule refuses
  await form.getByRole("textbox", { name: "Effect" }).click();
  await page.getByRole("option", { name: "permit", exact: true }).click();
  await form.getByRole("textbox", { name: "Users" }).fill("postgres");
  await form.getByRole("textbox", { name: "Users" }).press("Enter");
  await form.getByText("Rule 1 — permit read and write to postgres").waitFor();
  await shot(page, "guard-point-editor");
  await form.getByRole("button", { name: "Create guard point" }).click();
  const row = page.getByTestId("guard-points-table").getByRole("row").filter({ hasText: path });
  await row.getByText("learn").waitFor();
  await row.getByText("1 · default deny").waitFor();
  await shot(page, "guard-points");
  await done();
});

test("System: health, the audit chain, the active KEK and what it wraps, the HSM; an active KEK cannot be retired", async () => {
  const { page, context, done } = await open(STATE);
  await page.goto("/#/");
  await page.getByRole("link", { name: "System" }).click();
  await page.getByRole("heading", { name: "System", level: 1 }).waitFor();
  await page.getByTestId("system-health").locator('[data-status="ok"]').waitFor();
  for (const check of ["database", "hsm"]) await page.locator(`tr[data-check="${check}"]`).getByText("ok", { exact: true }).waitFor();
  // The replica serving this page reported itself (the test made it report before starting).
  await page.getByTestId("replicas").locator('tr[data-live="true"]').getByText("answered this page").waitFor();
  const active = ((await page.getByTestId("active-kek").textContent()) ?? "").trim();
  assert.ok(active.length > 0, "the active KEK is named");
  const row = page.getByTestId("kek-table").locator(`tr[data-kek="${active}"]`);
  await row.locator('[data-state="active"]').waitFor();
  assert.equal(await row.getByRole("button", { name: /Retire KEK/ }).count(), 0, "no retire for the active KEK");
  await page.getByText("Key wrapping").waitFor();
  const rotation = page.getByTestId("kek-rotation"); // the last rotation; one still running disables Rotate
  assert.equal(await page.getByTestId("rotate-kek").isEnabled(), true,
               `Rotate is offered: ${(await rotation.count()) ? await rotation.textContent() : "no rotation yet"}`);
  // The page shows what the server says: the same list over the API, the same refusal.
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value;
  const r = await context.request.post(`/api/v1/system/keks/${active}/retire`, { headers: { "X-CSRF-Token": csrf ?? "" } });
  assert.equal(r.status(), 409);
  assert.equal((await r.json()).code, "kek_active");
  await shot(page, "kek-hsm");
  await done();
});

test("KMIP clients: issue two in the console, download their files, revoke one by typing its name", async () => {
  const { page, done } = await open(STATE);
  await page.goto("/#/");
  await page.getByRole("link", { name: "KMIP clients" }).click();
  await page.getByRole("heading", { name: "KMIP clients", level: 1 }).waitFor();
  for (const [name, revoked] of [[KMIP_CLIENT, false], [KMIP_REVOKED, true]]) {
    await page.getByTestId("create-kmip-client").click();
    const form = page.getByRole("form", { name: "Create KMIP client" });
    await form.getByRole("textbox", { name: /Name/ }).fill(name);
    await form.getByTestId("create-kmip-client-submit").click();
    const issued = page.getByTestId("kmip-issued");
    await issued.getByText("The private key is shown this once").waitFor();
    for (const file of ["cert", "key", "ca"]) {
      const [dl] = await Promise.all([page.waitForEvent("download"), issued.getByRole("button", { name: `${name}-${file}.pem` }).click()]);
      assert.equal(dl.suggestedFilename(), `${name}-${file}.pem`);
      await dl.saveAs(join(E2E_OUT, `${name}-${file}.pem`));
    }
    if (!revoked) await shot(page, "kmip-issued");
    await page.getByTestId("kmip-issued-done").click();
    const row = page.getByTestId("kmip-clients-table").locator(`tr[data-client="${name}"]`);
    await row.locator('[data-status="active"]').waitFor();
    if (revoked) {
      await row.getByRole("button", { name: `Revoke KMIP client ${name}` }).click();
      assert.equal(await page.getByTestId("typed-confirm-submit").isDisabled(), true);
      await page.getByTestId("typed-confirm-input").fill(name);
      await page.getByTestId("typed-confirm-submit").click();
      await row.locator('[data-status="revoked"]').waitFor();
    }
  }
  await shot(page, "kmip-clients");
  await done();
});

test("databases: connect one, its token shown once; grant it a key; its read shows, and the key's page names it", async () => {
  const { page, context, done } = await open(STATE);
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const keyName = `${DATABASE}-key`;
  const made = await context.request.post("/api/v1/keys", { data: { name: keyName }, headers: { "X-CSRF-Token": csrf } });
  assert.equal(made.status(), 201, await made.text());
  await page.goto("/#/");
  await page.getByRole("link", { name: "Databases" }).click();
  await page.getByRole("heading", { name: "Databases", level: 1 }).waitFor();
  await page.getByTestId("connect-database").click();
  const form = page.getByRole("form", { name: "Connect a database" });
  await form.getByRole("textbox", { name: /Name/ }).fill(DATABASE);
  await form.getByRole("textbox", { name: /Description/ }).fill("Orders (the console's end-to-end test)");
  await form.getByTestId("connect-database-submit").click();
  const shown = page.getByRole("dialog", { name: `${DATABASE} connected` });
  const token = (await shown.getByTestId("database-token-value").textContent()).trim();
  const vaultUrl = (await shown.getByTestId("database-vault-url").textContent()).trim();
  assert.match(token, /^srdb_/);
  assert.ok((await shown.getByTestId("database-config").textContent()).includes(`hashicorp-key-management-token = ${token}`));
  await shot(page, "database-connected");
  await shown.getByTestId("database-token-done").click();
  await shown.waitFor({ state: "detached" });
  const row = page.getByTestId("databases-table").locator(`tr[data-database="${DATABASE}"]`);
  await row.getByText("none: it can read no key").waitFor();
  await row.getByRole("link", { name: DATABASE }).click();
  await page.getByTestId("database-name").waitFor();
  // Grant the key as MariaDB's default key id, proposed as 1.
  await page.getByTestId("grant-key").click();
  const grant = page.getByRole("form", { name: `Grant a key to ${DATABASE}` });
  assert.equal(await grant.getByRole("textbox", { name: /MariaDB key id/ }).inputValue(), "1");
  await grant.getByRole("textbox", { name: /^Key/ }).fill(keyName);
  await page.getByRole("option", { name: keyName, exact: true }).click();
  await grant.getByTestId("grant-key-submit").click();
  await grant.waitFor({ state: "detached" });
  await page.getByTestId("grants-table").locator('tr[data-key-id="1"]').getByRole("link", { name: keyName }).waitFor();
  // The database reads key id 1 over the KV front with its token: the page shows the read and its version.
  const read = await context.request.get(`${new URL(vaultUrl).pathname}/data/1`, { headers: { "X-Vault-Token": token } });
  assert.equal(read.status(), 200, await read.text());
  assert.equal((await read.json()).data.metadata.version, 1);
  await page.reload();
  const granted = page.getByTestId("grants-table").locator('tr[data-key-id="1"]');
  await granted.getByText("v1", { exact: true }).waitFor();
  await shot(page, "database-detail");
  // The key's page names the database that uses it, under its key id.
  await granted.getByRole("link", { name: keyName }).click();
  const usedBy = page.getByTestId("key-consumers");
  await usedBy.getByRole("link", { name: DATABASE }).waitFor();
  assert.match(await usedBy.locator(`tr[data-consumer="${DATABASE}"]`).textContent(), /key id 1/);
  await done();
});

test("volumes: a host's volumes and how each is open; revoke one by typing its name", async () => {
  const { page, done } = await open(STATE);
  await page.goto("/#/");
  await page.getByRole("link", { name: "Volumes" }).click();
  await page.getByRole("heading", { name: "Volumes", level: 1 }).waitFor();
  const table = page.getByTestId("volumes-table");
  const data = table.locator('tr[data-volume="pg-data"]').filter({ hasText: HOST.db1 });
  await data.locator('[data-state="open"]').waitFor();
  await data.getByText("userspace").waitFor();
  await data.getByText("200 GiB").waitFor();
  await shot(page, "volumes");
  await table.locator('tr[data-volume="pg-wal-old"]').filter({ hasText: HOST.db1 }).getByRole("link", { name: "pg-wal-old" }).click();
  await page.getByRole("heading", { name: "pg-wal-old", level: 1 }).waitFor();
  await page.getByTestId("volume-revoke").click();
  assert.equal(await page.getByTestId("typed-confirm-submit").isDisabled(), true);
  await page.getByTestId("typed-confirm-input").fill("pg-wal-old");
  await page.getByTestId("typed-confirm-submit").click();
  await page.getByText(/The server refuses to unseal this volume/).waitFor();
  await page.getByTestId("volume-events").getByText("volume.revoke", { exact: true }).waitFor();
  await shot(page, "volume-detail");
  await done();
});

test("keys: sort on the server by a column, rotate two selected keys with one typed confirmation", async () => {
  const { page, context, done } = await open(STATE);
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const batch = `bulk-${Date.now().toString(36)}`;
  for (const n of ["a", "b"]) {
    const r = await context.request.post("/api/v1/keys", { data: { name: `${batch}-${n}` }, headers: { "X-CSRF-Token": csrf } });
    assert.equal(r.status(), 201);
  }
  await page.goto(`/#/keys?q=${batch}`);
  await page.getByTestId("keys-table").locator(`tr[data-key="${batch}-a"]`).waitFor();
  await page.getByRole("button", { name: "Sort by name" }).click(); // name is the default: now descending
  await page.waitForURL(/sort=-name/);
  await until(async () => (await page.getByTestId("keys-table").locator("tbody tr").first().getAttribute("data-key")) === `${batch}-b`,
              () => "descending by name: b first");
  await page.getByRole("checkbox", { name: "Select every key on this page" }).check();
  await page.getByTestId("bulk-rotate").click();
  await page.getByTestId("bulk-confirm-input").fill("rotate 2 keys");
  await page.getByTestId("bulk-confirm-submit").click();
  await page.getByText("2 of 2 done").waitFor();
  await page.getByTestId("bulk-done").click();
  for (const n of ["a", "b"]) {
    const k = await (await context.request.get(`/api/v1/keys/${batch}-${n}`)).json();
    assert.equal(k.current_version, 2, `${batch}-${n} was rotated`);
  }
  await done();
});

test("an auditor sees keys and hosts read-only: no rotate, no enroll or revoke, and the API refuses them", async () => {
  const { page, context, done } = await open(undefined);
  await signIn(page, AUDITOR_USER, AUDITOR_PASSWORD);
  await page.getByRole("heading", { name: "Dashboard" }).waitFor();
  assert.equal(await page.getByTestId("role-badge").textContent(), "auditor");
  await page.goto("/#/keys");
  await page.getByTestId("keys-table").waitFor();
  assert.equal(await page.getByTestId("create-key").count(), 0, "no create button for an auditor");
  await page.goto(`/#/keys/${KEY}`);
  await page.getByTestId("key-name").waitFor();
  assert.equal(await page.getByTestId("rotate-key").isDisabled(), true, "rotate is disabled");
  assert.equal(await page.getByTestId("destroy-key").count(), 0);
  assert.equal(await page.getByTestId("revoke-key").count(), 0);
  // The server is the authority: the same request from this session is refused.
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value;
  const r = await context.request.post(`/api/v1/keys/${KEY}/rotate`, { headers: { "X-CSRF-Token": csrf ?? "" } });
  assert.equal(r.status(), 403);
  assert.equal((await r.json()).code, "forbidden");

  // Hosts: everything visible, nothing offered that an auditor cannot do.
  await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`); // this run's hosts, whatever else the store holds
  await page.getByTestId("hosts-table").locator(`tr[data-host="${HOST.db1}"]`).waitFor();
  await page.getByTestId("enrollment-tokens-table").waitFor();
  assert.equal(await page.getByTestId("enroll-host").count(), 0, "no Enroll button for an auditor");
  assert.equal(await page.getByRole("button", { name: /Revoke enrollment token/ }).count(), 0);
  await page.getByTestId("hosts-table").getByRole("link", { name: HOST.db1 }).click();
  await page.getByTestId("guard-points").waitFor();
  await page.getByTestId("host-events").waitFor();
  assert.equal(await page.getByTestId("revoke-host").count(), 0, "no Revoke host for an auditor");
  const e = await context.request.post("/api/v1/enrollment-tokens", {
    data: { host_group: HOST_GROUP }, headers: { "X-CSRF-Token": csrf ?? "" } });
  assert.equal(e.status(), 403);
  assert.equal((await e.json()).code, "forbidden");
  await done();
});

test("a shared link opened signed out lands, filters included, after signing in", async () => {
  const { page, done } = await open(undefined);
  await page.goto(`/#/audit?actor=${ADMIN_USER}`);
  await page.waitForURL(/#\/sign-in/);
  await page.getByLabel("Username").fill(ADMIN_USER); // on the page it was sent to (not a fresh visit)
  await page.locator('input[name="password"]').fill(ADMIN_NEW_PASSWORD);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(new RegExp(`#/audit\\?actor=${ADMIN_USER}$`));
  await page.getByRole("heading", { name: "Audit log" }).waitFor();
  await done();
});

for (const colorScheme of ["light", "dark"]) {
  test(`accessibility (${colorScheme}, 1440 px): axe-core finds no serious violation on any page or in any dialog`, async () => {
    const problems = [];
    const signedOut = await open(undefined, { colorScheme });
    await signedOut.page.setViewportSize({ width: 1440, height: 900 });
    await signedOut.page.goto("/#/sign-in");
    await signedOut.page.getByRole("button", { name: "Sign in" }).waitFor();
    problems.push(...(await axeViolations(signedOut.page)).map((v) => `sign-in: ${v}`));
    await signedOut.done();
    const { page, context, done } = await open(STATE, { colorScheme });
    await page.setViewportSize({ width: 1440, height: 900 });
    // A key in each state, so every state's badge is on the pages axe reads.
    const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
    const batch = `axe-${colorScheme}-${Date.now().toString(36)}`;
    const post = async (path, data) => {
      const r = await context.request.post(path, { data, headers: { "X-CSRF-Token": csrf } });
      assert.ok(r.ok(), `${path}: ${r.status()} ${await r.text()}`);
    };
    await post("/api/v1/keys", { name: `${batch}-pre`, activate: false });
    for (const [name, reason] of [["deactivated", "superseded"], ["compromised", "key-compromise"], ["destroyed", "superseded"]]) {
      await post("/api/v1/keys", { name: `${batch}-${name}` });
      await post(`/api/v1/keys/${batch}-${name}/revoke`, { reason });
    }
    await post(`/api/v1/keys/${batch}-destroyed/destroy`, { version: 1 });
    for (const path of ["/", "/keys", `/keys?q=${batch}`, `/keys/${batch}-destroyed`, `/keys/${KEY}`, "/hosts", `/hosts?group=${HOST_GROUP}`, "/guard-points", "/volumes", "/audit",
                        "/users", "/tokens", "/system", "/kmip-clients", "/kmip-clients?view=groups", "/kmip-clients?view=grants", "/databases",
                        `/databases/${DATABASE}`, "/aws-key-stores", "/approvals", "/account"]) {
      await page.goto(`/#${path}`);
      await page.locator("#main-content h1").first().waitFor();
      problems.push(...(await axeViolations(page)).map((v) => `${path}: ${v}`));
    }
    await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`); // this run's hosts, whatever else the store holds
    await page.getByTestId("hosts-table").getByRole("link", { name: HOST.db1 }).click();
    await page.getByTestId("guard-points").waitFor();
    problems.push(...(await axeViolations(page)).map((v) => `host detail: ${v}`));
    if (colorScheme === "dark") await shot(page, "host-detail-dark");
    // With each dialog and drawer open: what a screen reader meets there is the dialog.
    await withEachDialog(page, await dialogFixture(context, `axe-${colorScheme}`), async (name) => {
      problems.push(...(await axeViolations(page)).map((v) => `dialog ${name}: ${v}`));
    });
    writeFileSync(join(E2E_OUT, `axe-${colorScheme}.txt`), problems.join("\n") + "\n");
    assert.deepEqual(problems, [], problems.join("\n"));
    await done();
  });
}

for (const [width, height] of [[375, 812], [768, 1024], [1440, 900]]) {
  test(`at ${width} px nothing overflows and the navigation stays reachable`, async () => {
    const { page, context, done } = await open(STATE);
    await page.setViewportSize({ width, height });
    const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
    const key = `narrow-${width}-${Date.now().toString(36)}`;
    const made = await context.request.post("/api/v1/keys", { data: { name: key, tags: { env: "prod", "host-group": HOST_GROUP } },
                                                              headers: { "X-CSRF-Token": csrf } });
    assert.equal(made.status(), 201, await made.text());
    const wide = [];
    const problems = []; // axe at 375 px: every page, and each dialog open
    const measure = async (what) => {
      const [overflow, culprits] = await overflowOf(page);
      if (overflow > 0) wide.push(`${what} at ${width} px is ${overflow} px wider than the window: ${culprits.join("; ")}`);
      // A state badge shows its whole word, never "a…".
      const cut = await page.locator(".mantine-Badge-label").evaluateAll((els) =>
        els.filter((el) => el.getClientRects().length && el.scrollWidth > el.clientWidth + 1).map((el) => el.textContent));
      if (cut.length) wide.push(`${what} at ${width} px cuts badges: ${cut.slice(0, 5).join(", ")}`);
    };
    for (const path of ["/", "/keys", `/keys/${key}`, `/keys/${KEY}`, "/hosts", `/hosts?group=${HOST_GROUP}`, "/guard-points",
                        "/volumes", "/audit", "/users", "/tokens", "/system", "/kmip-clients", "/kmip-clients?view=groups",
                        "/kmip-clients?view=grants", "/databases", `/databases/${DATABASE}`, "/aws-key-stores", "/approvals", "/account"]) {
      await page.goto(`/#${path}`);
      await page.locator("#main-content h1").first().waitFor();
      await page.waitForLoadState("networkidle");
      await measure(path);
      if (width === 375) problems.push(...(await axeViolations(page)).map((v) => `${path} at ${width} px: ${v}`));
      // The header is never under the navigation: its home link can be clicked.
      await page.getByRole("link", { name: "Strongroom home" }).click({ trial: true });
    }
    // A host's page: its guard points, its keys and its activity table.
    await page.goto(`/#/hosts?q=${DOMAIN_OF(HOST.db1)}`);
    await page.getByTestId("hosts-table").getByRole("link", { name: HOST.db1 }).click();
    await page.getByTestId("host-events").waitFor();
    await page.waitForLoadState("networkidle");
    await measure("host detail");
    if (width === 375) problems.push(...(await axeViolations(page)).map((v) => `host detail at ${width} px: ${v}`));
    // A volume's page.
    await page.goto("/#/volumes");
    await page.getByTestId("volumes-table").locator('tr[data-volume="pg-data"]').filter({ hasText: HOST.db1 })
      .getByRole("link", { name: "pg-data" }).click();
    await page.getByRole("heading", { name: "pg-data", level: 1 }).waitFor();
    await page.waitForLoadState("networkidle");
    await measure("volume detail");
    if (width === 375) problems.push(...(await axeViolations(page)).map((v) => `volume detail at ${width} px: ${v}`));
    // A phone shows each dialog and drawer within its width, its × on the screen, and clean
    // under axe (what a phone's screen reader meets there is the dialog).
    if (width === 375) {
      await withEachDialog(page, await dialogFixture(context, `w${width}`), async (name, dialog, close) => {
        await measure(`dialog ${name}`);
        const box = await (close ?? dialog).boundingBox();
        if (!box || box.x < 0 || box.x + box.width > width) wide.push(`dialog ${name}: its close button is off the screen`);
        problems.push(...(await axeViolations(page)).map((v) => `dialog ${name} at ${width} px: ${v}`));
      });
      writeFileSync(join(E2E_OUT, `axe-${width}.txt`), problems.join("\n") + "\n");
    }
    assert.deepEqual(wide, [], wide.join("\n"));
    assert.deepEqual(problems, [], problems.join("\n"));
    const menu = page.getByRole("button", { name: "Open navigation" });
    // Folded away = moved off the screen (and inert): its links are not where anyone can reach them.
    const onScreen = async () => {
      const box = await page.locator('nav[aria-label="Main"]').boundingBox();
      return box !== null && box.x + box.width > 0 && box.x < width;
    };
    if (width < 768) {
      assert.ok(await menu.isVisible(), "a menu button on a phone");
      await until(async () => !(await onScreen()), () => "navigation folded away");
      await menu.click();
      await until(onScreen, () => "the menu button opens the navigation");
      await page.locator('nav[aria-label="Main"]').getByRole("link", { name: "Keys", exact: true }).click();
      await page.waitForURL(/#\/keys$/);
      await until(async () => !(await onScreen()), () => "closed after choosing");
    } else {
      assert.ok(!(await menu.isVisible()), "no menu button when the navigation fits");
      assert.ok(await onScreen(), "the navigation is shown beside the page");
    }
    await page.goto("/#/keys");
    await shot(page, `keys-${width}`);
    await done();
  });
}

/** The scroll boxes in the page's content that scroll sideways now (a table wider than its
 *  box): overflowOf does not see them, since they keep the page itself within the window. */
async function sidewaysOf(page) {
  return page.evaluate(() => [...document.querySelectorAll("#main-content *")].filter((el) => {
    const x = getComputedStyle(el).overflowX;
    return (x === "auto" || x === "scroll") && el.getClientRects().length && el.scrollWidth > el.clientWidth + 1;
  }).map((el) => `${el.querySelector("table")?.dataset.testid ?? el.className.slice(0, 60)}: ${el.scrollWidth} px in ${el.clientWidth}`));
}

test("at 1,400 and 1,440 px the KMIP clients page's tables fit: nothing scrolls sideways", async () => {
  const { page, context, done } = await open(STATE);
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  // A long name wraps only after its dots: the client that once pushed the table past a 1,400 px window.
  const name = `vcenter${Date.now().toString(36)}.datacenter01.${DOMAIN_OF(HOST.db1)}`;
  const made = await context.request.post("/api/v1/kmip/clients", { data: { name, role: "key-officer", key_export: "wrapped", csr: null },
                                                                    headers: { "X-CSRF-Token": csrf } });
  assert.equal(made.status(), 201, await made.text());
  const wide = [];
  for (const width of [1400, 1440]) {
    await page.setViewportSize({ width, height: 900 });
    for (const path of ["/kmip-clients", "/kmip-clients?view=groups", "/kmip-clients?view=grants"]) {
      await page.goto(`/#${path}`);
      await page.locator("#main-content h1").first().waitFor();
      await page.waitForLoadState("networkidle");
      wide.push(...(await sidewaysOf(page)).map((s) => `${path} at ${width} px scrolls sideways: ${s}`));
      const [overflow, culprits] = await overflowOf(page);
      if (overflow > 0) wide.push(`${path} at ${width} px is ${overflow} px wider than the window: ${culprits.join("; ")}`);
    }
  }
  const revoked = await context.request.delete(`/api/v1/kmip/clients/${(await made.json()).client.id}`, { headers: { "X-CSRF-Token": csrf } });
  assert.ok(revoked.ok(), await revoked.text());
  assert.deepEqual(wide, [], wide.join("\n"));
  await done();
});

test("your account: set up a second factor with an authenticator's code; sign-in then asks for it", async () => {
  // A person of their own (the administrator's sign-ins elsewhere stay password-only).
  const admin = await open(STATE);
  const csrf = (await admin.context.cookies()).find((c) => c.name === "strongroom_csrf")?.value ?? "";
  const user = `e2e-totp-${Date.now().toString(36)}`;
  const made = await admin.context.request.post("/api/v1/users", { data: { username: user, role: "auditor" },
                                                                   headers: { "X-CSRF-Token": csrf } });
  assert.equal(made.status(), 201, await made.text());
  const otp = (await made.json()).one_time_password;
  await admin.done();
  // The password alone is answered 401 totp_required once the factor is on (then the code is asked for).
  const { page, done } = await open(undefined, { allow: [/status of 401/] });
  const password = "a passphrase of my own choosing 42";
  await firstSignIn(page, user, otp, password);
  await page.getByTestId("whoami").click(); // the username in the header opens the account page
  await page.getByRole("heading", { name: "Your account" }).waitFor();
  await page.getByTestId("totp-start").click();
  await page.getByRole("img", { name: /^QR code of your authenticator key/ }).waitFor();
  const key = (await page.getByTestId("totp-secret").textContent()).trim();
  await shot(page, "account-totp");
  const code = totp(key);
  await page.getByTestId("totp-code").locator("input").first().click();
  await page.keyboard.type(code);
  await page.getByTestId("totp-confirm").click();
  await page.getByTestId("totp-on").waitFor();
  // Signed out and in again: the password alone is no longer enough.
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/#\/sign-in/);
  await signIn(page, user, password);
  const codeField = page.getByLabel("Authenticator code");
  await codeField.waitFor();
  // Each code signs in once: wait for the authenticator's next one.
  const next = Math.ceil((Date.now() + 1) / 30_000) * 30_000;
  await new Promise((r) => setTimeout(r, next - Date.now() + 200));
  await codeField.fill(totp(key));
  await page.getByRole("button", { name: "Sign in" }).click();
  const dashboard = page.getByRole("heading", { name: "Dashboard" });
  const refused = page.locator("form").getByText("Sign-in failed");
  await until(async () => (await dashboard.count()) + (await refused.count()) > 0,
              () => `neither signed in nor refused: ${page.url()}`);
  assert.equal(await refused.count(), 0, "the code was refused");
  await done();
});

test("an ended session sends the person back to sign-in with a message", async () => {
  const { page, context, done } = await open(STATE, { allow: [/status of 401/] });
  await page.goto("/#/keys");
  await page.getByTestId("keys-table").waitFor();
  // End the session server-side (as an idle timeout or a sign-out elsewhere would).
  const csrf = (await context.cookies()).find((c) => c.name === "strongroom_csrf")?.value;
  const r = await context.request.post("/api/v1/auth/logout", { headers: { "X-CSRF-Token": csrf ?? "" } });
  assert.equal(r.status(), 204);
  await context.addCookies([{ name: "strongroom_csrf", value: csrf ?? "", url: BASE_URL }]);
  await context.addCookies([{ name: "strongroom_session", value: "ended", url: BASE_URL, httpOnly: true }]);
  await page.getByRole("link", { name: "Audit log" }).click();
  await page.waitForURL(/#\/sign-in/);
  await page.getByTestId("signin-notice").getByText(/session/i).waitFor();
  await done();
});
