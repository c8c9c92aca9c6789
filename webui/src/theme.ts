import { createTheme, virtualColor, type ButtonProps } from "@mantine/core";

// Calm and dense: neutral greys, one dark accent, system fonts, tight radii.
// "ink" is the accent: near-black on light pages, a dark grey that still reads as a
// button on dark ones (the system's colour scheme decides, App.tsx).
export const theme = createTheme({
  colors: { ink: virtualColor({ name: "ink", light: "dark", dark: "gray" }) },
  primaryColor: "ink",
  defaultRadius: "sm",
  fontFamily: "Inter, 'Segoe UI', system-ui, -apple-system, 'Helvetica Neue', Arial, sans-serif",
  fontFamilyMonospace: "'JetBrains Mono', 'DejaVu Sans Mono', ui-monospace, Menlo, Consolas, monospace",
  headings: { fontWeight: "650" },
  fontSizes: { sm: "13.5px" },
  components: {
    Table: { defaultProps: { striped: false, withRowBorders: true } },
    // Underlined: within a sentence a link differs by more than its colour, which on dark
    // pages cannot be 3:1 from the text around it (axe: link-in-text-block).
    Anchor: { defaultProps: { c: "var(--sr-link)", underline: "always" } },
    // White on Mantine's red 6 is 3.3:1; red 8 is 5.7:1 (axe: color-contrast, WCAG AA 4.5:1).
    Button: { vars: (_: unknown, props: ButtonProps) => (props.color === "red" && (props.variant ?? "filled") === "filled"
      ? { root: { "--button-bg": "var(--mantine-color-red-8)", "--button-hover": "var(--mantine-color-red-9)" } }
      : { root: {} }) },
    // A table wider than a phone scrolls in its box; the box takes focus, so a keyboard can
    // scroll it too (axe: scrollable-region-focusable).
    TableScrollContainer: { defaultProps: { scrollAreaProps: { viewportProps: { tabIndex: 0 } } } },
    // A state is a word of its own: in a narrow cell the cell wraps, the badge never shrinks to "a…".
    Badge: { styles: { root: { flexShrink: 0, overflow: "visible" },
                       label: { textTransform: "none", letterSpacing: 0.1, overflow: "visible" } } },
    // The × is an icon only: without a name a screen reader announces "button" (axe: critical).
    Modal: { defaultProps: { closeButtonProps: { "aria-label": "Close dialog" } } },
    Drawer: { defaultProps: { closeButtonProps: { "aria-label": "Close panel" } } },
  },
});
