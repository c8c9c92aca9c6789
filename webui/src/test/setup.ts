import "@testing-library/jest-dom/vitest";
import { cleanup, configure } from "@testing-library/react";
import { notifications } from "@mantine/notifications";
import { afterEach, vi } from "vitest";
import { installFakeFetch, resetFakeApi } from "./fakeApi";

installFakeFetch();
// findBy/waitFor wait for an element, not for a speed: on a loaded machine a render can
// take seconds, and the default second made tests fail for no fault of the console.
configure({ asyncUtilTimeout: 10_000 });
// Each test starts from nothing: unmounted, no fake server, no spy, no queued notification.
// What outlives a test (a portal, a dialog still leaving) would be the next test's
// "element not found" on a busy machine: it fails here instead, in the test that left it.
afterEach(() => {
  cleanup();
  resetFakeApi();
  vi.restoreAllMocks();
  notifications.clean();
  const left = document.body.innerHTML;
  document.body.innerHTML = "";
  if (left) throw new Error(`the test left this in the page after unmounting: ${left.slice(0, 300)}`);
});

// jsdom lacks these; Mantine uses them.
Object.defineProperty(window, "matchMedia", {
  writable: true,
  value: (query: string) => ({
    matches: false, media: query, onchange: null,
    addListener: () => {}, removeListener: () => {}, addEventListener: () => {}, removeEventListener: () => {},
    dispatchEvent: () => false,
  }),
});
class RO { observe() {} unobserve() {} disconnect() {} }
(window as unknown as { ResizeObserver: typeof RO }).ResizeObserver = RO;
window.HTMLElement.prototype.scrollIntoView = () => {};
