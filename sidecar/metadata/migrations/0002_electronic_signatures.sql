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

-- A signature change notifies the ids of the chunks of the document version(s)
-- it concerns, like a change to those chunks would.
CREATE FUNCTION retrieval_gate_signatures_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM retrieval_gate_notify(c.chunk_id)
        FROM chunks AS c WHERE c.doc_id = OLD.doc_id AND c.version = OLD.version;
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE'
            AND (NEW.doc_id, NEW.version) IS DISTINCT FROM (OLD.doc_id, OLD.version)) THEN
        PERFORM retrieval_gate_notify(c.chunk_id)
        FROM chunks AS c WHERE c.doc_id = NEW.doc_id AND c.version = NEW.version;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER electronic_signatures_notify
    AFTER INSERT OR UPDATE OR DELETE ON electronic_signatures
    FOR EACH ROW EXECUTE FUNCTION retrieval_gate_signatures_changed();
CREATE TRIGGER electronic_signatures_notify_truncate AFTER TRUNCATE ON electronic_signatures
    FOR EACH STATEMENT EXECUTE FUNCTION retrieval_gate_flush();
