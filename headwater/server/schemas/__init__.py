"""Topic schemas: `schema_registry` (the versions, the four schema requests and the produce
check), `schema_rules` (parsing a definition, checking a value, compatibility) and `json_compat`
(whether one JSON Schema accepts everything another does)."""
