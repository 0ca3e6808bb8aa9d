//! Settings of the NATS consumer.

use std::time::Duration;

/// Settings of the NATS JetStream consumer: a member of a consumer group over the partitioned
/// subjects of its topics. Its `Debug` hides the URL's password.
///
/// ```
/// let nats = inoutbox::nats::NatsConfig::new("nats://127.0.0.1:4222", ["orders"])
///     .partitions(6)
///     .dead_letter_subject("orders.dlq");
/// assert_eq!(nats.partitions, 6);
/// ```
#[derive(Clone)]
#[non_exhaustive]
#[must_use]
pub struct NatsConfig {
    /// The server URL (`nats://host:4222`).
    pub url: String,
    /// Topics: each partition is the subject `<topic>.<partition>` in a stream of its own.
    pub topics: Vec<String>,
    /// Partitions per topic (default 3): the relay's publisher must use the same number.
    pub partitions: u32,
    /// How long a lease on a partition lasts unless renewed (default 10 s). A member that dies
    /// loses its partitions after at most this, plus one renewal interval (a third of it) for
    /// another member to notice; a member paused longer than this cannot acknowledge any more.
    pub lease_ttl: Duration,
    /// The key-value bucket of the leases (default `inoutbox_leases`). Every member of every
    /// group on the server shares it; its TTL is the lease TTL, so groups sharing a bucket
    /// share the TTL.
    pub lease_bucket: String,
    /// How long JetStream waits for an acknowledgement before it delivers a message again to
    /// the consumer (default 60 s). The member drops such repeats of what it delivered already.
    pub ack_wait: Duration,
    /// Messages buffered per partition before the reader waits for the partition's run.
    pub partition_buffer: usize,
    /// Where dead letters are also published (besides the dead-letter table), if anywhere: a
    /// subject, with a stream of its own created for it.
    pub dead_letter_subject: Option<String>,
    /// How long the consumer waits at start-up for the server (default 30 s).
    pub startup_timeout: Duration,
    /// How long a graceful stop waits for the messages in hand (default 30 s).
    pub shutdown_grace: Duration,
}

impl NatsConfig {
    /// A consumer of `topics` on the server at `url`.
    pub fn new<I, S>(url: impl Into<String>, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            url: url.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            partitions: 3,
            lease_ttl: Duration::from_secs(10),
            lease_bucket: "inoutbox_leases".to_owned(),
            ack_wait: Duration::from_secs(60),
            partition_buffer: 256,
            dead_letter_subject: None,
            startup_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    /// Partitions per topic.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions.max(1);
        self
    }

    /// The lease TTL (at least 1 s: the renewal runs every third of it).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// The lease bucket.
    pub fn lease_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.lease_bucket = bucket.into();
        self
    }

    /// JetStream's acknowledgement wait.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// Publishes dead letters to this subject too.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// The start-up timeout.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The grace period of a graceful stop.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How often leases are renewed and free partitions looked for: a third of the TTL.
    pub(super) fn renew_interval(&self) -> Duration {
        self.lease_ttl / 3
    }
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("topics", &self.topics)
            .field("partitions", &self.partitions)
            .field("lease_ttl", &self.lease_ttl)
            .field("lease_bucket", &self.lease_bucket)
            .field("ack_wait", &self.ack_wait)
            .field("partition_buffer", &self.partition_buffer)
            .field("dead_letter_subject", &self.dead_letter_subject)
            .field("startup_timeout", &self.startup_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_hides_the_urls_password() {
        let config = super::NatsConfig::new("nats://app:hunter2@127.0.0.1:4222", ["orders"]);
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
