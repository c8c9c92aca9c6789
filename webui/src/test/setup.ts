import "@testing-library/jest-dom/vitest";
import { cleanup, configure } from "@testing-library/react";
import { afterEach } from "vitest";
import { installFakeFetch, resetFakeApi } from "./fakeApi";

installFakeFetch();
// findBy/waitFor wait for an element, not for a speed: on a loaded machine a render can
// take seconds, and the default second made tests fail for no fault of the console.
configure({ asyncUtilTimeout: 10_000 });
afterEach(() => { cleanup(); resetFakeApi(); });

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
