// One action on a key, done in the web console by a person: Debian's Chromium driven by
// playwright-core (webui/node_modules, no browser download), signed in as an admin.
// Run by tests/integrations/test_console_observed.py:
//   BASE_URL=... TRUST_SPKI=... WEBUI=... USERNAME=... PASSWORD=... KEY=... ACTION=rotate|revoke \
//   [DATABASE=...] node console_actions.mjs
// Prints one JSON line of what the console showed; exits non-zero on any failure.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { join } from "node:path";

const env = (name) => {
  const v = process.env[name];
  if (v === undefined) throw new Error(`set ${name}`);
  return v;
};
const BASE_URL = env("BASE_URL").replace(/\/$/, "");
const KEY = env("KEY");
const ACTION = env("ACTION");
const TIMEOUT = 20_000;
const { chromium } = createRequire(join(env("WEBUI"), "package.json"))("playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         // the browser trusts exactly the key server's key, as a user who imported its CA would
         `--ignore-certificate-errors-spki-list=${env("TRUST_SPKI")}`],
});
const errors = [];
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, baseURL: BASE_URL });
  context.setDefaultTimeout(TIMEOUT);
  const page = await context.newPage();
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });

  await page.goto("/#/sign-in");
  await page.getByLabel("Username").fill(env("USERNAME"));
  await page.locator('input[name="password"]').fill(env("PASSWORD"));
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Dashboard" }).waitFor();

  await page.goto(`/#/keys/${KEY}`);
  await page.getByTestId("key-name").getByText(KEY).waitFor();
  const timeline = page.getByTestId("version-timeline");
  let shown = {};
  if (ACTION === "rotate") {
    await timeline.getByText("v1").waitFor();
    await page.getByTestId("rotate-key").click();
    await timeline.getByText("v2").waitFor();
    shown = { versions: await timeline.locator("[data-state]").evaluateAll(
      (els) => els.map((el) => el.getAttribute("data-state"))) };
  } else if (ACTION === "revoke") {
    await page.getByTestId("revoke-key").click();
    const dialog = page.getByRole("dialog", { name: `Revoke ${KEY}` });
    // The warning names the databases that read the key (their grants), before anything is typed.
    const warning = dialog.getByTestId("revoke-databases-warning");
    await warning.getByText(env("DATABASE"), { exact: false }).waitFor();
    shown = { warning: await warning.textContent() };
    const submit = dialog.getByTestId("typed-confirm-submit");
    assert.equal(await submit.isDisabled(), true, "Revoke key is disabled until the name is typed");
    await dialog.getByTestId("typed-confirm-input").fill(KEY);
    assert.equal(await submit.textContent(), "Revoke key");
    await submit.click();
    await dialog.waitFor({ state: "detached" });
    await timeline.locator('[data-state="active"]').waitFor({ state: "detached" });
  } else {
    throw new Error(`ACTION=${ACTION}: rotate or revoke`);
  }
  assert.deepEqual(errors, []);
  console.log(JSON.stringify({ action: ACTION, ...shown }));
  await context.close();
} finally {
  await browser.close();
}
