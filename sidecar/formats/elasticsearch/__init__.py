"""Elasticsearch and OpenSearch: the REST adapter, its route rules, request rewriter and
where the tenant term goes in a search body."""
