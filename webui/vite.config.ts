/// <reference types="vitest/config" />
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// The keyserver serves dist/ at "/"; during development, `npm run dev` proxies the API
// to a keyserver on STRONGROOM_URL (default http://127.0.0.1:8800).
export default defineConfig({
  plugins: [react()],
  build: { chunkSizeWarningLimit: 1500, sourcemap: false },
  server: {
    proxy: { "/api": process.env.STRONGROOM_URL ?? "http://127.0.0.1:8800" },
  },
  test: {
    environment: "jsdom",
    setupFiles: ["./src/test/setup.ts"],
    include: ["src/**/*.test.{ts,tsx}"],
    css: false,
    globals: true,
  },
});
