"""The reference application: a clickstream analytics pipeline with one regime per part."""
