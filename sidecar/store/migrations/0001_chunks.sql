-- The chunk records (docs/architecture.md, "The chunk record"): one column per field,
-- with the record contract as CHECK constraints, so that operators' own tools
-- can read and update the table and still cannot store a record the gate could
-- not decode.

CREATE FUNCTION retrieval_gate_principals_ok(principals text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT array_ndims(principals) = 1
       AND cardinality(principals) > 0
       AND NOT EXISTS (SELECT 1 FROM unnest(principals) AS p WHERE p IS NULL OR p !~ '\S')
$$;

CREATE TABLE chunks (
    chunk_id text PRIMARY KEY CONSTRAINT chunks_chunk_id_not_blank CHECK (chunk_id ~ '\S'),
    doc_id text NOT NULL CONSTRAINT chunks_doc_id_not_blank CHECK (doc_id ~ '\S'),
    version text NOT NULL DEFAULT '',
    tenant_id text NOT NULL CONSTRAINT chunks_tenant_id_not_blank CHECK (tenant_id ~ '\S'),
    allowed_principals text[] NOT NULL
        CONSTRAINT chunks_allowed_principals_valid
        CHECK (retrieval_gate_principals_ok(allowed_principals)),
    status text NOT NULL CONSTRAINT chunks_status_valid
        CHECK (status IN ('approved', 'draft', 'superseded', 'revoked', 'quarantined')),
    -- Finite and within years 1-9999, the range every client can represent.
    effective_at timestamptz NOT NULL CONSTRAINT chunks_effective_at_in_range
        CHECK (effective_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    expires_at timestamptz CONSTRAINT chunks_expires_at_after_effective_at
        CHECK (expires_at > effective_at AND expires_at <= '9999-12-31 23:59:59.999999+00'),
    sha256 text NOT NULL CONSTRAINT chunks_sha256_format CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    source_uri text NOT NULL DEFAULT '',
    superseded_by text CONSTRAINT chunks_superseded_by_valid
        CHECK (superseded_by ~ '\S' AND superseded_by <> chunk_id),
    requires_signature boolean NOT NULL DEFAULT false,
    text text
);

-- Signatures are kept per document version; this finds the chunks they cover.
CREATE INDEX chunks_doc_id_version ON chunks (doc_id, version);

-- Live invalidation: every committed change to a row notifies each listening
-- sidecar with the chunk id as payload. An empty payload means "forget
-- everything" (chunk ids are never blank): sent for TRUNCATE, for ids too long
-- for a notification, and by anyone who runs NOTIFY retrieval_gate_chunks.
CREATE FUNCTION retrieval_gate_notify(chunk_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$
    -- A payload must stay under 8000 bytes.
    SELECT pg_notify('retrieval_gate_chunks',
                     CASE WHEN octet_length(chunk_id) < 7900 THEN chunk_id ELSE '' END)
$$;

CREATE FUNCTION retrieval_gate_chunks_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM retrieval_gate_notify(OLD.chunk_id);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.chunk_id <> OLD.chunk_id) THEN
        PERFORM retrieval_gate_notify(NEW.chunk_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION retrieval_gate_flush() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('retrieval_gate_chunks', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER chunks_notify AFTER INSERT OR UPDATE OR DELETE ON chunks
    FOR EACH ROW EXECUTE FUNCTION retrieval_gate_chunks_changed();
CREATE TRIGGER chunks_notify_truncate AFTER TRUNCATE ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION retrieval_gate_flush();
