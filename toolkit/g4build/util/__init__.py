"""Small shared helpers every layer may use: hardened YAML loading, shell quoting, fault injection."""
