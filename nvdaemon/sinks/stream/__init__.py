"""The stream sink: the websocket hub behind ``/v1/events`` (``hub``), live and best effort.

What it promises: each client gets the events that match its filters in publish order, each encoded once for all
clients; a replay (``since=``, ``replay=``) and the live stream are one step, so nothing between them is lost or
sent twice. What it does not: the ring buffer (``bufferSize`` events) is in memory, so a restart empties it (a
reload keeps it); a client that falls ``clientQueue`` events behind is closed with 1013, one over ``maxClients`` is
refused, and each is counted (``nodevitals_stream_disconnects_total{reason}``); neither the engine nor the other
clients ever wait for a slow one. Nothing is imported here.
"""
