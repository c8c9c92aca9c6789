import { Alert, Button, Center, Divider, Paper, PasswordInput, Stack, Text, TextInput, Title } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { Navigate, useLocation, useNavigate, useSearchParams } from "react-router";
import { api, call } from "../api/client";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { Brand } from "../Layout";

export function SignInPage() {
  const { me, notice, signedIn } = useAuth();
  const navigate = useNavigate();
  const location = useLocation();
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  // Asked for once the server says the account has a second factor (totp_required).
  const [needCode, setNeedCode] = useState(false);
  const [code, setCode] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  // Single sign-on, when the server has an identity provider; its refusals come back here.
  const methods = useQuery({ queryKey: ["auth", "methods"], queryFn: () => call(api.GET("/api/v1/auth/methods")),
                             retry: false, staleTime: Infinity });
  const [params] = useSearchParams();
  const ssoError = params.get("sso_error");
  // Where a signed-out visit was sent from (Layout), filters included. Used here as well
  // as after the sign-in call: signing in re-renders this page with `me` set first.
  const from = (location.state as { from?: string } | null)?.from;
  const next = from && from !== "/sign-in" ? from : "/";
  if (me) return <Navigate to={me.must_change_password ? "/change-password" : next} replace />;

  // Spaces and dashes as authenticators show them go; a seventh digit is refused, not cut.
  const codeError = needCode && code.length > 6 ? `6 digits; this one has ${code.length}` : null;
  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    if (codeError) return;
    setBusy(true);
    setError(null);
    try {
      const body = needCode ? { username, password, totp_code: code } : { username, password };
      const res = await call(api.POST("/api/v1/auth/login", { body }));
      signedIn(res.user);
      navigate(res.user.must_change_password ? "/change-password" : next, { replace: true });
    } catch (err) {
      if ((err as { code?: string })?.code === "totp_required") {
        setNeedCode(true);
        setError(null);
      } else {
        setError(err);
      }
    } finally {
      setBusy(false);
    }
  };

  return (
    <AuthFrame>
      <Title order={1} size="h3" mb={4}>Sign in</Title>
      <Text size="sm" c="dimmed" mb="md">Key management console</Text>
      {notice && <Alert color="blue" variant="light" mb="md" data-testid="signin-notice">{notice}</Alert>}
      {ssoError && (
        <Alert color="red" variant="light" mb="md" title="Single sign-on failed" data-testid="sso-error">
          {ssoError}
        </Alert>
      )}
      <form onSubmit={submit} aria-label="Sign in">
        <Stack gap="sm">
          <TextInput label="Username" name="username" autoComplete="username" required autoFocus
                     value={username} onChange={(e) => setUsername(e.currentTarget.value)} />
          <PasswordInput label="Password" name="password" autoComplete="current-password" required
                         value={password} onChange={(e) => setPassword(e.currentTarget.value)} />
          {needCode && (
            <TextInput label="Authenticator code" name="totp" autoComplete="one-time-code" inputMode="numeric"
                       required autoFocus description="The 6-digit code your authenticator app shows" error={codeError}
                       value={code} onChange={(e) => setCode(e.currentTarget.value.replace(/\D/g, ""))} />
          )}
          <ErrorAlert error={error} title="Sign-in failed" />
          <Button type="submit" loading={busy} fullWidth color="ink">Sign in</Button>
        </Stack>
      </form>
      {methods.data?.oidc && (
        <>
          <Divider label="or" labelPosition="center" my="md" />
          {/* A full-page navigation: the identity provider's pages are not ours. */}
          <Button component="a" href="/api/v1/auth/oidc/login" variant="default" fullWidth>
            Sign in with your organisation (single sign-on)
          </Button>
        </>
      )}
    </AuthFrame>
  );
}

export function AuthFrame({ children }: { children: React.ReactNode }) {
  return (
    <Center component="main" mih="100vh" bg="#141b26" p="md">
      <Stack w={380} maw="100%" gap="md">
        <Center><Brand light /></Center>
        <Paper p="xl" radius="md" shadow="md" withBorder>{children}</Paper>
        <Text size="xs" c="#8a96a8" ta="center">
          Every sign-in and every action is recorded in the tamper-evident audit log.
        </Text>
      </Stack>
    </Center>
  );
}

export function ChangePasswordPage() {
  const { me, refresh, signOut } = useAuth();
  const navigate = useNavigate();
  const [current, setCurrent] = useState("");
  const [next, setNext] = useState("");
  const [again, setAgain] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  if (!me) return <Navigate to="/sign-in" replace />;
  const mismatch = again.length > 0 && again !== next;
  // The server's rules (keyserver/core/identity.py), said before they are broken.
  const hasName = next.length > 0 && next.toLowerCase().includes(me.username.toLowerCase());

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    if (mismatch || hasName) return;
    setBusy(true);
    setError(null);
    try {
      await call(api.POST("/api/v1/auth/password", { body: { current_password: current, new_password: next } }));
      await refresh();
      navigate("/", { replace: true });
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <AuthFrame>
      <Title order={1} size="h3" mb={4}>Choose your password</Title>
      <Text size="sm" c="dimmed" mb="md">
        {me.must_change_password
          ? `Signed in as ${me.username} with a one-time password. Choose your own before you continue.`
          : `Change the password of ${me.username}.`}
      </Text>
      <form onSubmit={submit} aria-label="Change password">
        <Stack gap="sm">
          <PasswordInput label="Current (one-time) password" name="current_password" autoComplete="current-password" required
                         value={current} onChange={(e) => setCurrent(e.currentTarget.value)} />
          <PasswordInput label="New password" name="new_password" autoComplete="new-password" required
                         description={`At least 12 characters, not containing your username (${me.username}); `
                                      + "a passphrase is best."}
                         error={hasName ? "It contains your username: the server refuses that." : undefined}
                         value={next} onChange={(e) => setNext(e.currentTarget.value)} />
          <PasswordInput label="New password again" name="new_password_again" autoComplete="new-password" required
                         error={mismatch ? "The passwords do not match" : undefined}
                         value={again} onChange={(e) => setAgain(e.currentTarget.value)} />
          <ErrorAlert error={error} title="Password not changed" />
          <Button type="submit" loading={busy} color="ink" disabled={mismatch || hasName}>Save password</Button>
          <Button variant="subtle" color="gray" onClick={async () => { await signOut(); navigate("/sign-in"); }}>
            Sign out
          </Button>
        </Stack>
      </form>
    </AuthFrame>
  );
}
