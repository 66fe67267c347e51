-- The hash over a chunk's declared payload fields (docs/architecture.md, "The
-- chunk record"). Nullable: existing records vouch for no payload field, so a
-- hit that carries hashed fields is rejected PAYLOAD_HASH_MISMATCH until its
-- record is reloaded with payload_sha256. A nullable column without a default
-- rewrites no rows; the constraint check reads the table once.

ALTER TABLE chunks ADD COLUMN payload_sha256 text
    CONSTRAINT chunks_payload_sha256_format CHECK (payload_sha256 ~ '^[0-9a-f]{64}$');
