-- A dead letter an operator closed for good (an op wrong forever: unknown, forged, self-signed):
-- who, when and why, kept for audit. A resolved dead letter is no longer an open finding; the op
-- stays refused (nothing of it reaches the lake).
ALTER TABLE oml.lake_dead_letter
    ADD COLUMN IF NOT EXISTS resolved_at timestamptz,
    ADD COLUMN IF NOT EXISTS resolved_by text,
    ADD COLUMN IF NOT EXISTS resolution  text;
