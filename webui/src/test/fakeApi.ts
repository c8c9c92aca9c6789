// The key server, faked at the fetch layer for component tests: the typed client, its
// middleware and error handling run as in the browser; only the network is replaced.
//
//   const server = fakeApi({
//     "GET /api/v1/hosts": [host],                                   // 200 + JSON
//     "POST /api/v1/hosts/:id/revoke": ({ params }) => ({ ...host }),
//     "GET /api/v1/hosts/:id": () => problem(404, "host_not_found", "no host …"),
//   });
//   …
//   expect(server.calls("POST /api/v1/hosts/:id/revoke")).toHaveLength(1);
//
// A request no route answers gets a 501 problem and is listed in `server.unmatched`.

export interface FakeRequest {
  method: string;
  path: string;
  url: URL;
  params: Record<string, string>;
  body: unknown;
}

/** A Response as is, anything else as 200 JSON. */
type Reply = object | string | number | boolean | null;
type Route = Reply | ((req: FakeRequest) => Reply | Promise<Reply>);

export function json(status: number, body: unknown): Response {
  return new Response(body === undefined ? null : JSON.stringify(body),
                      { status, headers: { "content-type": "application/json" } });
}

export function problem(status: number, code: string, detail: string): Response {
  return new Response(JSON.stringify({ type: `https://strongroom.dev/problems/${code}`, title: code, status, code,
                                       detail, request_id: "req-test" }),
                      { status, headers: { "content-type": "application/problem+json" } });
}

interface Compiled { key: string; method: string; re: RegExp; names: string[]; route: Route }

function compile(key: string, route: Route): Compiled {
  const [method, pattern] = key.split(" ");
  const names: string[] = [];
  const re = new RegExp("^" + pattern.replace(/[.+?^${}()|[\]\\]/g, "\\$&")
    .replace(/:([a-z_]+)/gi, (_, n: string) => { names.push(n); return "([^/]+)"; }) + "$");
  return { key, method, re, names, route };
}

export interface FakeServer {
  /** Requests answered by the route `key` ("METHOD /path/:param"), in order. */
  calls: (key: string) => FakeRequest[];
  /** Requests no route answered ("METHOD /path?query"). */
  unmatched: string[];
  /** Replace or add routes. */
  set: (routes: Record<string, Route>) => void;
}

let handler: ((req: Request) => Promise<Response>) | null = null;

export function fakeApi(routes: Record<string, Route>): FakeServer {
  let compiled = Object.entries(routes).map(([k, r]) => compile(k, r));
  const log: { key: string; req: FakeRequest }[] = [];
  const unmatched: string[] = [];
  handler = async (request) => {
    const url = new URL(request.url);
    const text = await request.text();
    let body: unknown = undefined;
    if (text) { try { body = JSON.parse(text); } catch { body = text; } }
    for (const c of compiled) {
      const m = c.method === request.method ? c.re.exec(url.pathname) : null;
      if (!m) continue;
      const params = Object.fromEntries(c.names.map((n, i) => [n, decodeURIComponent(m[i + 1])]));
      const req = { method: request.method, path: url.pathname, url, params, body };
      log.push({ key: c.key, req });
      const reply = typeof c.route === "function" ? await (c.route as (r: FakeRequest) => Reply)(req) : c.route;
      return reply instanceof Response ? reply : json(200, reply);
    }
    unmatched.push(`${request.method} ${url.pathname}${url.search}`);
    return problem(501, "not_faked", `the test fakes no ${request.method} ${url.pathname}`);
  };
  return {
    calls: (key) => log.filter((l) => l.key === key).map((l) => l.req),
    unmatched,
    set: (more) => {
      const keys = new Set(Object.keys(more));
      compiled = [...Object.entries(more).map(([k, r]) => compile(k, r)), ...compiled.filter((c) => !keys.has(c.key))];
    },
  };
}

export function resetFakeApi() {
  handler = null;
}

/**
 * Installed by the test setup before any module creates the API client (which keeps the
 * `fetch` and `Request` it finds): relative URLs resolve against the page, as in a browser.
 */
export function installFakeFetch() {
  const NodeRequest = globalThis.Request;
  class PageRequest extends NodeRequest {
    constructor(input: RequestInfo | URL, init?: RequestInit) {
      super(typeof input === "string" ? new URL(input, window.location.href).href : input, init);
    }
  }
  globalThis.Request = PageRequest as typeof Request;
  globalThis.fetch = async (input: RequestInfo | URL, init?: RequestInit) => {
    const request = new PageRequest(input, init);
    if (!handler) throw new TypeError(`no fake API in this test for ${request.method} ${request.url}`);
    return handler(request);
  };
}
