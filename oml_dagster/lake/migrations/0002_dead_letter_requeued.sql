-- The batch statement looks up, per op, the dead letter it was requeued from (fetch.py).
CREATE INDEX lake_dead_letter_requeued ON oml.lake_dead_letter (requeued_id)
    WHERE requeued_id IS NOT NULL;
