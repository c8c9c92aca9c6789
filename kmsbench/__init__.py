"""`kms-bench`: the seed reports' benchmarks on the user's own machine, plain vs
encrypted side by side in one run, written up as Markdown, HTML, PNG charts and JSON
(docs/benchmarks.md, "kms-bench")."""
