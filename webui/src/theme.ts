import { createTheme } from "@mantine/core";

// Calm and dense: neutral greys, one dark accent, system fonts, tight radii.
export const theme = createTheme({
  primaryColor: "dark",
  defaultRadius: "sm",
  fontFamily: "Inter, 'Segoe UI', system-ui, -apple-system, 'Helvetica Neue', Arial, sans-serif",
  fontFamilyMonospace: "'JetBrains Mono', 'DejaVu Sans Mono', ui-monospace, Menlo, Consolas, monospace",
  headings: { fontWeight: "650" },
  fontSizes: { sm: "13.5px" },
  components: {
    Table: { defaultProps: { striped: false, withRowBorders: true } },
    Anchor: { defaultProps: { c: "blue.8" } },
    Badge: { styles: { label: { textTransform: "none", letterSpacing: 0.1 } } },
  },
});
