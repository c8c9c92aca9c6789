import { Alert, Code, Text } from "@mantine/core";
import { IconAlertTriangle } from "@tabler/icons-react";
import { ApiError } from "../api/client";

/** What the person can do about an error, by its stable code. */
export function hintFor(err: ApiError): string | null {
  switch (err.code) {
    case "forbidden":
      return "Your role does not allow this action. Ask an administrator if you need it.";
    case "csrf_failed":
      return "The page's security token is stale. Reload the page, then try again.";
    case "bad_credentials":
      return "Check the username and password. Repeated failures lock the account for a while.";
    case "rate_limited":
      return `Too many attempts. Wait${err.retryAfter ? ` ${err.retryAfter} seconds` : " a moment"} and try again.`;
    case "session_expired":
    case "session_replaced":
    case "session_invalid":
    case "unauthenticated":
      return "Sign in again to continue.";
    case "password_change_required":
      return "Choose a new password first.";
    case "wrong_password":
      return "The current password is not correct.";
    case "key_exists":
    case "user_exists":
    case "kmip_client_exists":
      return "Choose another name: names are unique.";
    case "database_exists":
      return "Choose another name: names are unique, and a revoked database keeps its name.";
    case "database_revoked":
      return "A revoked database stays revoked: connect it again under a new name.";
    case "xks_store_exists":
      return "Choose another name: names are unique, and a revoked key store keeps its name.";
    case "xks_store_revoked":
      return "A revoked key store stays revoked: connect a new one and grant its keys there.";
    case "external_id_in_use":
      return "Remove the key with that external key id first, or choose another external key id.";
    case "no_previous_credential":
      return "Nothing to retire: reload the page to see the key store's credentials.";
    case "key_id_in_use":
      return "Remove the grant with that key id first, or choose another key id.";
    case "key_not_active":
      return "Activate the key on its page, or grant another key.";
    case "key_not_exportable":
      return "Grant a key whose policy lets its material leave: a database reads the key itself.";
    case "wrong_key_algorithm":
      return err.detail.includes("external key store") ? "Grant an AES-256 key: AWS KMS's external keys are AES-256."
        : "Grant an AES key: databases encrypt with AES.";
    case "invalid_search":
      return "Search for words of letters or digits (at most eight); end one with * for a prefix.";
    case "last_admin":
      return "Create or enable another administrator first.";
    case "hsm_unavailable":
    case "database_unavailable":
    case "unavailable":
      return "Nothing was changed. The server cannot reach a dependency; retry shortly or check /readyz.";
    case "kek_in_use":
      return "Rotate the KEK again to re-wrap what it still wraps, then retire it.";
    case "kek_active":
      return "Rotate to a new KEK first; the active one cannot be retired.";
    case "rotation_running":
      return "Wait for the running KEK rotation to finish (its progress is on this page).";
    case "version_active":
      return "Rotate the key first: the newest version is active, and only older versions are retired.";
    case "retirement_running":
      return "A retirement of this version is already running: open the version's inventory to follow or cancel it.";
    case "version_retired":
      return "Nothing is left to retire: destroy the version (Destroy, then pick it).";
    case "retirement_not_running":
    case "retirement_changed":
      return "The retirement changed meanwhile: reload the inventory, then decide again.";
    case "holder_excluded":
      return "Nothing to do: that holder is excluded already.";
    case "object_not_found":
      return "Check the unique identifier with the KMIP client that made the object, or find it as the object ID of its kmip.register or kmip.create_key_pair record in the audit log.";
    case "kmip_grant_exists":
      return "Revoke that grant in the Grants list first, then grant again with the rights wanted.";
    case "version_in_use":
      return "Retire the version first (Versions → Retire version…), then destroy it; or shred on purpose.";
    case "network":
      return null;
    case "validation_error":
    case "invalid_input":
      return "Correct the value named above and submit again.";
    default:
      return byStatus(err.status);
  }
}

/** What to do next when the code has no advice of its own: every error says something. */
function byStatus(status: number): string | null {
  if (status === 400 || status === 422) return "Correct the value named above and submit again.";
  if (status === 404) return "It may have been removed or renamed: go back to the list and open it again.";
  if (status === 409) return "Reload the page to see its current state, then decide again.";
  if (status === 413) return "Send less: shorten the text or the file and try again.";
  if (status >= 500) return "Retry in a moment. If it persists, give your administrator the request id below.";
  return null;
}

export function errorTitle(err: ApiError): string {
  if (err.status === 0) return "Server unreachable";
  if (err.status === 403) return "Not allowed";
  if (err.status === 404) return "Not found";
  if (err.status === 409) return "Conflict";
  if (err.status === 401) return "Not signed in";
  if (err.status === 429) return "Slow down";
  if (err.status >= 500) return "Server problem";
  return "Request refused";
}

export function ErrorAlert({ error, title }: { error: unknown; title?: string }) {
  if (!error) return null;
  const err = error instanceof ApiError ? error
    : new ApiError({ status: 0, code: "client_error", detail: error instanceof Error ? error.message : String(error) });
  const hint = hintFor(err);
  return (
    <Alert color="red" variant="light" role="alert" icon={<IconAlertTriangle size={18} />}
           title={title ?? errorTitle(err)} data-testid="api-error">
      <Text size="sm">{err.detail}</Text>
      {hint && <Text size="sm" mt={4} fw={500}>{hint}</Text>}
      {(err.code || err.requestId) && (
        <Text size="xs" c="dimmed" mt={6}>
          {err.code && <>code <Code>{err.code}</Code></>}
          {err.requestId && <> · request <Code>{err.requestId}</Code></>}
        </Text>
      )}
    </Alert>
  );
}
