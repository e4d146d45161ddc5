"""Who may do what: principals from bearer tokens and client certificates, roles per tenant, the
per-method rules and the server interceptor that applies them (docs/operations.md, "Security")."""
