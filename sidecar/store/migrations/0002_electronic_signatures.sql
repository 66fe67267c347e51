-- Electronic signatures (21 CFR Part 11 style) per document version. A chunk
-- whose record requires a signature is admitted only while a row with
-- is_valid = true exists for its doc_id and version. A withdrawn signature is
-- marked is_valid = false rather than deleted, so the history stays.

CREATE TABLE electronic_signatures (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    doc_id text NOT NULL CONSTRAINT electronic_signatures_doc_id_not_blank CHECK (doc_id ~ '\S'),
    version text NOT NULL,
    signer text NOT NULL CONSTRAINT electronic_signatures_signer_not_blank CHECK (signer ~ '\S'),
    meaning text NOT NULL
        CONSTRAINT electronic_signatures_meaning_not_blank CHECK (meaning ~ '\S'),
    signed_at timestamptz NOT NULL,
    is_valid boolean NOT NULL DEFAULT true
);

CREATE INDEX electronic_signatures_valid ON electronic_signatures (doc_id, version)
    WHERE is_valid;

-- A signature change flushes every sidecar's cache rather than naming the
-- chunks of its document version. Naming them would miss a chunk that a
-- concurrent, not yet committed transaction moves into that version: its own
-- notification can be handled while the withdrawn signature still looks
-- valid, and the withdrawal's notification never named it. Signature changes
-- are rare, so a flush costs little.
CREATE TRIGGER electronic_signatures_notify
    AFTER INSERT OR UPDATE OR DELETE ON electronic_signatures
    FOR EACH STATEMENT EXECUTE FUNCTION retrieval_gate_flush();
CREATE TRIGGER electronic_signatures_notify_truncate AFTER TRUNCATE ON electronic_signatures
    FOR EACH STATEMENT EXECUTE FUNCTION retrieval_gate_flush();
