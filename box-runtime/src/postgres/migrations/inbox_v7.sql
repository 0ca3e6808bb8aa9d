-- inoutbox migration (inbox, 7): the retention task purges done effects, oldest first.
-- Names in braces are filled in from the configured table names (see store::migrate).
CREATE INDEX IF NOT EXISTS {effects:done_idx} ON {effects} (done_at) WHERE done_at IS NOT NULL;
