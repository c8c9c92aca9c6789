// The server's GET /api/v1/hosts for the fake API: the same filters, counts per status
// over the other filters, every group, and paging (order: as given).
import type { Host } from "../api/client";
import { HOST_STATUSES, hostStatus } from "../hosts";

export function hostPage(hosts: Host[], url: URL) {
  const p = url.searchParams;
  const q = (p.get("q") ?? "").toLowerCase();
  const group = p.get("group");
  const status = p.get("status");
  const limit = Number(p.get("limit") ?? "100");
  const offset = Number(p.get("offset") ?? "0");
  const others = hosts.filter((h) => (!group || h.host_group === group)
    && (!q || [h.hostname, h.host_group, h.last_seen_ip ?? "", h.os].some((f) => f.toLowerCase().includes(q))));
  const counts = Object.fromEntries(HOST_STATUSES.map((s) => [s, others.filter((h) => hostStatus(h) === s).length]));
  const matching = status ? others.filter((h) => hostStatus(h) === status) : others;
  return {
    items: matching.slice(offset, offset + limit), total: matching.length, limit, offset, counts,
    groups: [...new Set(hosts.map((h) => h.host_group))].sort(),
  };
}
