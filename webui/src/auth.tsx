// Who is signed in, what they may do, and how the session ends.
import { useQuery, useQueryClient } from "@tanstack/react-query";
import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from "react";
import { ApiError, api, call, onAuthProblem, readCookie, type Me } from "./api/client";

export type Permission =
  | "keys:read" | "keys:create" | "keys:update" | "keys:rotate" | "keys:activate" | "keys:revoke"
  | "keys:destroy" | "keys:encrypt" | "keys:decrypt" | "keys:verify" | "datakeys:generate" | "datakeys:decrypt" | "audit:read" | "audit:verify"
  | "users:read" | "users:manage" | "tokens:own" | "tokens:all" | "system:read" | "system:kek"
  | "keys:export" | "keys:export-wrapped" | "kmip:clients" | "hosts:read" | "hosts:enroll" | "hosts:revoke" | "guardpoints:manage" | "volumes:manage"
  | "databases:read" | "databases:manage" | "xks:read" | "xks:manage" | "kmip:all-objects";

export interface AuthState {
  me: Me | null;
  loading: boolean;
  /** Why the user was sent back to sign-in (session expired, signed out...). */
  notice: string | null;
  can: (p: Permission) => boolean;
  signedIn: (me: Me) => void;
  signOut: () => Promise<void>;
  refresh: () => Promise<void>;
}

const AuthContext = createContext<AuthState | null>(null);

export const ME_KEY = ["auth", "me"] as const;

/** What the sign-in page says after the server ended a session (the 401's problem code). */
export function signedOutNotice(code: string): string {
  switch (code) {
    case "session_expired":
      return "Your session expired. Sign in again to continue.";
    case "session_replaced":
      return "This account's password was changed after you signed in. Sign in again with the new password.";
    default:
      return "Your session has ended. Sign in again to continue.";
  }
}

/** The notice of a sign-out the person asked for: the next sign-in starts at the dashboard. */
export const SIGNED_OUT = "You have signed out.";

export function AuthProvider({ children }: { children: ReactNode }) {
  const qc = useQueryClient();
  const [notice, setNotice] = useState<string | null>(null);
  const meQuery = useQuery({
    queryKey: ME_KEY,
    queryFn: async () => {
      // Sign-in sets the readable CSRF cookie beside the HttpOnly session cookie: without
      // it there is no session, and asking would only log a 401 in the console.
      if (!readCookie("strongroom_csrf")) return null;
      try {
        return await call(api.GET("/api/v1/auth/me"));
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) return null;
        throw e;
      }
    },
    staleTime: 60_000,
    retry: false,
  });

  useEffect(() => onAuthProblem((err) => {
    if (err.code === "password_change_required") {
      void qc.invalidateQueries({ queryKey: ME_KEY });
      return;
    }
    // 401: the session ended (idle timeout, lifetime, reset, disabled, signed out elsewhere).
    const wasSignedIn = qc.getQueryData(ME_KEY) != null;
    if (wasSignedIn) {
      setNotice(signedOutNotice(err.code));
      qc.setQueryData(ME_KEY, null);
      qc.removeQueries({ predicate: (q) => q.queryKey[0] !== "auth" });
    }
  }), [qc]);

  const signedIn = useCallback((me: Me) => {
    setNotice(null);
    qc.setQueryData(ME_KEY, me);
  }, [qc]);

  const signOut = useCallback(async () => {
    try {
      await call(api.POST("/api/v1/auth/logout"));
    } catch {
      // Already signed out: nothing to undo.
    }
    setNotice(SIGNED_OUT);
    qc.clear();
    qc.setQueryData(ME_KEY, null);
  }, [qc]);

  const refresh = useCallback(async () => {
    await qc.invalidateQueries({ queryKey: ME_KEY });
  }, [qc]);

  const me = meQuery.data ?? null;
  const value = useMemo<AuthState>(() => ({
    me,
    loading: meQuery.isPending,
    notice,
    can: (p) => !!me && !me.must_change_password && me.permissions.includes(p),
    signedIn, signOut, refresh,
  }), [me, meQuery.isPending, notice, signedIn, signOut, refresh]);
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export function useAuth(): AuthState {
  const ctx = useContext(AuthContext);
  if (!ctx) throw new Error("useAuth outside AuthProvider");
  return ctx;
}

/** For tests and stories: a fixed identity. */
export function StaticAuth({ me, notice = null, children }: { me: Me | null; notice?: string | null; children: ReactNode }) {
  const value = useMemo<AuthState>(() => ({
    me, loading: false, notice,
    can: (p) => !!me && me.permissions.includes(p),
    signedIn: () => undefined, signOut: async () => undefined, refresh: async () => undefined,
  }), [me, notice]);
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}
