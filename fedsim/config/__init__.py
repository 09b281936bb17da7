"""Scenario schema (pydantic, frozen, extra="forbid") and YAML loading: the only place that
parses user input. Errors name the YAML path of what is wrong."""
