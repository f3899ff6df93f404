package aggregator

// WriteAckTimeout is writeAckTimeout, for the external tests.
const WriteAckTimeout = writeAckTimeout
