"""The contracts between the parts: what the extractor and the trainer write and the monitor reads
(events, the output layout and its manifest, units, reject classes, capture points, data facts).
The only part of hsmon/ that extractor/ and trainer/ import; no heavy imports."""
