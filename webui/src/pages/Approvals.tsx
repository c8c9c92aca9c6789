// The two-person rule's waiting room (STRONGROOM_APPROVALS): what someone asked for, who
// has approved it, and — for the people who may — approve or reject it. An approval that
// is the last one needed runs the action at once, as the person who asked.
import { Badge, Button, Group, Modal, SegmentedControl, Stack, Table, Text } from "@mantine/core";
import { notifications } from "@mantine/notifications";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { api, call, type Schemas } from "../api/client";
import { HELD } from "../approvals";
import { useAuth } from "../auth";
import { ErrorAlert } from "../components/ErrorAlert";
import { EmptyState, Loading, fmtRelative, fmtTime } from "../components/bits";
import { PageHeader } from "../components/PageHeader";

type Approval = Schemas["ApprovalPublic"];

const STATE_COLOUR: Record<Approval["state"], string> = {
  pending: "yellow", approved: "blue", executed: "teal", failed: "red", rejected: "gray", expired: "gray",
};

export const APPROVALS_KEY = ["approvals"] as const;

function describe(a: Approval): string {
  const params = Object.entries(a.params).map(([k, v]) => `${k}: ${String(v)}`).join(", ");
  return params ? `${a.target} (${params})` : a.target;
}

export function ApprovalsPage() {
  const { me, can } = useAuth();
  const qc = useQueryClient();
  const [view, setView] = useState<"pending" | "all">("pending");
  const [deciding, setDeciding] = useState<{ a: Approval; verdict: "approve" | "reject" } | null>(null);
  const list = useQuery({
    queryKey: [...APPROVALS_KEY, view],
    queryFn: () => call(api.GET("/api/v1/approvals", { params: { query: { state: view === "pending" ? "pending" : undefined } } })),
    refetchInterval: 15_000,
  });
  const decide = useMutation({
    mutationFn: async ({ a, verdict }: { a: Approval; verdict: "approve" | "reject" }) => verdict === "approve"
      ? call(api.POST("/api/v1/approvals/{request_id}/approve", { params: { path: { request_id: a.id } } }))
      : { approval: await call(api.POST("/api/v1/approvals/{request_id}/reject", { params: { path: { request_id: a.id } } })),
          executed: false },
    onSuccess: (d, { verdict }) => {
      void qc.invalidateQueries({ queryKey: APPROVALS_KEY });
      const a = d.approval;
      const left = a.required - a.approvals.length;
      notifications.show({
        color: verdict === "reject" ? "gray" : a.state === "failed" ? "red" : "teal",
        title: verdict === "reject" ? "Rejected" : d.executed ? "Approved and done" : a.state === "failed" ? "Approved, but it failed" : "Approved",
        message: verdict === "reject" ? `${HELD[a.action]?.label ?? a.action} will not run.`
          : d.executed ? `${HELD[a.action]?.label ?? a.action} ran as ${a.requested_by}.`
          : a.state === "failed" ? (a.result ?? "see the audit log") : `${left} more approval${left === 1 ? "" : "s"} needed.`,
      });
      setDeciding(null);
    },
  });
  const rows = list.data ?? [];
  return (
    <Stack gap="md">
      <PageHeader title="Approvals"
        subtitle="The two-person rule: key destruction, KEK rotation and retirement, plaintext export, and changes of who may approve (accounts, roles, credentials, API tokens for other accounts) wait here until someone else approves." />
      <div role="group" aria-label="Which requests">
        <SegmentedControl value={view} onChange={(v) => setView(v as "pending" | "all")}
                          data={[{ value: "pending", label: "Waiting" }, { value: "all", label: "All" }]} />
      </div>
      {list.error ? <ErrorAlert error={list.error} /> : !list.data ? <Loading /> : rows.length === 0 ? (
        <EmptyState title={view === "pending" ? "Nothing waits for approval" : "No requests yet"}>
          When the server runs with STRONGROOM_APPROVALS (for example key.destroy=1), those actions wait here for
          another person who holds the action's permission.
        </EmptyState>
      ) : (
        <Table.ScrollContainer minWidth={860}>
          <Table fz="sm" verticalSpacing={6} data-testid="approvals-table">
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Asked</Table.Th><Table.Th>Action</Table.Th><Table.Th>On</Table.Th><Table.Th>By</Table.Th>
                <Table.Th>Approvals</Table.Th><Table.Th>State</Table.Th><Table.Th><span className="sr-only">Decide</span></Table.Th>
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {rows.map((a) => {
                const held = HELD[a.action];
                const mine = a.requested_by === me?.username;
                const already = a.approvals.some((x) => x.by === me?.username);
                const may = a.state === "pending" && held !== undefined && can(held.perm);
                return (
                  <Table.Tr key={a.id} data-testid="approval-row" data-action={a.action} data-state={a.state}>
                    <Table.Td title={fmtTime(a.created_at)}>{fmtRelative(a.created_at)}</Table.Td>
                    <Table.Td>{held?.label ?? a.action}</Table.Td>
                    <Table.Td ff="monospace" style={{ wordBreak: "break-all" }}>{describe(a)}</Table.Td>
                    <Table.Td>{a.requested_by}</Table.Td>
                    <Table.Td>
                      {a.approvals.length} of {a.required}
                      {a.approvals.length > 0 && <Text size="xs" c="dimmed">{a.approvals.map((x) => String(x.by)).join(", ")}</Text>}
                    </Table.Td>
                    <Table.Td>
                      <Badge variant="light" color={STATE_COLOUR[a.state]}>{a.state}</Badge>
                      {a.state === "pending" && <Text size="xs" c="dimmed">expires {fmtRelative(a.expires_at)}</Text>}
                      {a.result && <Text size="xs" c="var(--sr-text-danger)">{a.result}</Text>}
                    </Table.Td>
                    <Table.Td>
                      {may && (mine ? <Text size="xs" c="dimmed">asked by you: someone else approves</Text>
                        : already ? <Text size="xs" c="dimmed">approved by you</Text> : (
                          <Group gap="xs" wrap="nowrap">
                            <Button size="xs" color="ink" onClick={() => setDeciding({ a, verdict: "approve" })}
                                    aria-label={`Approve: ${held.label}, ${a.target}`}>Approve</Button>
                            <Button size="xs" variant="default" onClick={() => setDeciding({ a, verdict: "reject" })}
                                    aria-label={`Reject: ${held.label}, ${a.target}`}>Reject</Button>
                          </Group>
                        ))}
                    </Table.Td>
                  </Table.Tr>
                );
              })}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
      <Modal opened={deciding !== null} onClose={() => { setDeciding(null); decide.reset(); }}
             title={deciding ? `${deciding.verdict === "approve" ? "Approve" : "Reject"}: ${HELD[deciding.a.action]?.label ?? deciding.a.action}` : ""}>
        {deciding && (
          <Stack gap="sm">
            <Text size="sm"><b>{deciding.a.requested_by}</b> asked for this on <b>{describe(deciding.a)}</b>.</Text>
            {deciding.verdict === "approve" ? (
              <Text size="sm">
                {deciding.a.required - deciding.a.approvals.length <= 1
                  ? `Yours is the last approval needed: it runs now, as ${deciding.a.requested_by}, and cannot be undone.`
                  : `${deciding.a.required - deciding.a.approvals.length - 1} more approval(s) will still be needed after yours.`}
              </Text>
            ) : <Text size="sm">It will not run; {deciding.a.requested_by} can ask again.</Text>}
            {decide.error != null && <ErrorAlert error={decide.error} />}
            <Group justify="flex-end">
              <Button variant="default" onClick={() => { setDeciding(null); decide.reset(); }}>Cancel</Button>
              <Button color={deciding.verdict === "approve" ? "ink" : "red"} loading={decide.isPending}
                      onClick={() => decide.mutate(deciding)} data-testid="approval-confirm">
                {deciding.verdict === "approve" ? "Approve" : "Reject"}
              </Button>
            </Group>
          </Stack>
        )}
      </Modal>
    </Stack>
  );
}
