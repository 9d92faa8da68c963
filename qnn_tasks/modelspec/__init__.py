"""YAML -> a frozen Project: loading, checks, the verify/pipeline sections, the spec cache."""
