/// <reference types="vitest/config" />
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// The keyserver serves dist/ at "/"; during development, `npm run dev` proxies the API
// (and the CA certificate download) to a keyserver on STRONGROOM_URL (default
// https://127.0.0.1:8800; Node trusts its CA with NODE_EXTRA_CA_CERTS=../data/ca.pem).
const upstream = process.env.STRONGROOM_URL ?? "https://127.0.0.1:8800";
export default defineConfig({
  plugins: [react()],
  build: { chunkSizeWarningLimit: 1500, sourcemap: false },
  server: {
    proxy: { "/api": upstream, "/ca.pem": upstream },
  },
  test: {
    environment: "jsdom",
    setupFiles: ["./src/test/setup.ts"],
    include: ["src/**/*.test.{ts,tsx}"],
    css: false,
    globals: true,
    // Dialog flows typed key by key in jsdom take a few seconds; more on a busy machine.
    testTimeout: 20_000,
  },
});
