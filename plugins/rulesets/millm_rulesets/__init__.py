"""millm rule sets: mi.ruleset/v1 documents and the rule signals reported beside probes."""
