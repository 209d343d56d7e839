"""Output constraints (JSON schema, regex, choice, grammar, structural tag) compiled with xgrammar."""
