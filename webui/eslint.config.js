// The console's lint: typescript-eslint's recommended rules and React's rules of hooks.
// Small on purpose; tsc --noEmit checks the types, this checks what types cannot.
import js from "@eslint/js";
import reactHooks from "eslint-plugin-react-hooks";
import globals from "globals";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist", "node_modules", "src/api/schema.ts"] },
  {
    files: ["**/*.{ts,tsx}"],
    extends: [js.configs.recommended, ...tseslint.configs.recommended],
    languageOptions: { globals: globals.browser },
    plugins: { "react-hooks": reactHooks },
    rules: {
      "react-hooks/rules-of-hooks": "error",
      "react-hooks/exhaustive-deps": "error",
      // `_`-prefixed names are deliberately unused (a destructured field left out).
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_",
                                                       caughtErrors: "none" }],
    },
  },
  {
    files: ["**/*.{js,mjs,cjs}"],
    extends: [js.configs.recommended],
    languageOptions: { globals: globals.node },
  },
  {
    // The end-to-end run hands functions to page.evaluate: they run in the browser.
    files: ["e2e/**"],
    languageOptions: { globals: { ...globals.node, ...globals.browser } },
  },
);
