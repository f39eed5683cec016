"""The h2 backend: one uvloop thread per worker speaks HTTP/2 itself (:mod:`.http2`)."""
