//! The gRPC messages in a carried stream's DATA, as far as their sizes go.
//!
//! gRPC writes each message as a 5-byte prefix — a compression flag and the
//! message's length, 4 bytes big-endian — then the message. The gateway
//! carries the bytes without decoding messages; it reads only the prefixes,
//! across however the peer cut the stream into frames, so that a message
//! longer than the configured limit ends the stream before any of it goes
//! on to a sidecar that would refuse it only once it had all arrived.

/// Where a stream is in its messages.
#[derive(Debug, Clone)]
pub struct Messages {
    limit: u32,
    /// Prefix bytes of the next message read so far.
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
}

/// A message's prefix declared more than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    /// The length the prefix declared.
    pub declared: u32,
    /// The limit it passed.
    pub limit: u32,
}

impl Messages {
    /// Before the first message, allowing messages of up to `limit` bytes.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            prefix: [0; 5],
            have: 0,
            remaining: 0,
        }
    }

    /// Reads the next `data` of the stream; the first message over the
    /// limit is an error (and the stream must end: nothing after it is
    /// read).
    pub fn read(&mut self, mut data: &[u8]) -> Result<(), TooLarge> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let [_, a, b, c, d] = self.prefix;
                let declared = u32::from_be_bytes([a, b, c, d]);
                if declared > self.limit {
                    return Err(TooLarge {
                        declared,
                        limit: self.limit,
                    });
                }
                self.remaining = u64::from(declared);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m.resize(5 + len as usize, 7);
        m
    }

    #[test]
    fn messages_up_to_the_limit_pass_however_the_stream_is_cut() {
        let stream: Vec<u8> = [message(0), message(10), message(100), message(3)].concat();
        for cut in 1..stream.len() {
            let mut m = Messages::new(100);
            for chunk in stream.chunks(cut) {
                assert_eq!(m.read(chunk), Ok(()), "cut {cut}");
            }
        }
    }

    #[test]
    fn the_first_message_over_the_limit_is_refused_from_its_prefix() {
        // Only the prefix of the large message arrives, cut in the middle.
        let stream: Vec<u8> = [message(10), message(101)[..5].to_vec()].concat();
        for cut in 1..stream.len() {
            let mut m = Messages::new(100);
            let verdicts: Vec<_> = stream.chunks(cut).map(|c| m.read(c)).collect();
            assert_eq!(
                verdicts.last(),
                Some(&Err(TooLarge {
                    declared: 101,
                    limit: 100
                })),
                "cut {cut}"
            );
            assert!(verdicts[..verdicts.len() - 1].iter().all(Result::is_ok));
        }
        // A length in the message's body is not a prefix.
        let mut m = Messages::new(100);
        let mut body = message(20);
        body[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(m.read(&body), Ok(()));
    }
}
