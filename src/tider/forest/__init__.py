"""T-Mem evidence-forest back end: evidence utility selection (select), UPDATE/EXPAND/ROOT
structuring (structure), IDF span compression (compress), linearization (linearize) and
the paper's prompts (prompts)."""
