-- What stands before a notification in its line: the unsent ones of its job and target, in the
-- order they were recorded (the rowid). Each receiver gets a job's notifications in that order.
CREATE INDEX IF NOT EXISTS ll_notifications_open_line ON ll_notifications (job, target_id) WHERE status IN ('pending', 'sending');
