// A real OpenID provider for the key server's OIDC tests (node-oidc-provider, with its
// development sign-in pages: any login name, any password). Not part of the product.
//
//   node e2e/oidc-provider.mjs PORT CERT KEY REDIRECT_URI CLIENT_SECRET
//
// Accounts: a login that starts with "admin" is in the group "kms-admins", one that
// starts with "audit" in "kms-auditors", anyone else in no group.
import https from "node:https";
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const [port, certFile, keyFile, redirectUri, secret] = process.argv.slice(2);
const issuer = `https://localhost:${port}`;
const groupsOf = (id) => (id.startsWith("admin") ? ["kms-admins"] : id.startsWith("audit") ? ["kms-auditors"] : []);

const provider = new Provider(issuer, {
  clients: [{
    client_id: "strongroom", client_secret: secret, redirect_uris: [redirectUri],
    response_types: ["code"], grant_types: ["authorization_code"], token_endpoint_auth_method: "client_secret_basic",
  }],
  claims: { openid: ["sub"], profile: ["preferred_username", "name"], groups: ["groups"] },
  scopes: ["openid", "profile", "groups"],
  features: { devInteractions: { enabled: true } },
  conformIdTokenClaims: false, // the requested claims go into the ID token itself
  pkce: { required: () => true },
  async findAccount(_ctx, id) {
    return { accountId: id, async claims() { return { sub: id, preferred_username: id, name: id, groups: groupsOf(id) }; } };
  },
  cookies: { keys: ["test-only-cookie-key"] },
});
provider.proxy = true;
https.createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, provider.callback())
  .listen(Number(port), "127.0.0.1", () => console.log(`listening ${issuer}`));
