import { Button, Tooltip, type ButtonProps } from "@mantine/core";
import type { ReactNode } from "react";
import { useAuth, type Permission } from "../auth";

type Props = ButtonProps & {
  perm: Permission;
  /** "hide": not rendered without the permission; "disable" (default): shown, disabled, with why. */
  mode?: "hide" | "disable";
  onClick?: () => void;
  children: ReactNode;
  "data-testid"?: string;
};

/** A button that exists only for roles that may use it (read-only roles see it disabled). */
export function GuardedButton({ perm, mode = "disable", children, disabled, ...rest }: Props) {
  const { can, me } = useAuth();
  const allowed = can(perm);
  if (!allowed && mode === "hide") return null;
  if (!allowed) {
    return (
      <Tooltip label={`Your role (${me?.role ?? "none"}) lacks ${perm}`} withArrow>
        <Button {...rest} disabled data-disabled aria-disabled="true"
                title={`Requires the ${perm} permission`}>
          {children}
        </Button>
      </Tooltip>
    );
  }
  return <Button {...rest} disabled={disabled}>{children}</Button>;
}

export function Can({ perm, children, fallback = null }: { perm: Permission; children: ReactNode; fallback?: ReactNode }) {
  const { can } = useAuth();
  return <>{can(perm) ? children : fallback}</>;
}
