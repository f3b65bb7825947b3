"""Model lifecycle: pipeline versions, the traffic policy that routes between them, its store,
and the canary guard that rolls a bad canary back (docs/design.md, "Model lifecycle")."""
