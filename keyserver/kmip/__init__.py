"""KMIP over mutual TLS. PyKMIP is the codec only; the engine is ours.

Module map (imports go left to right, then into keyserver/core):
listener (TLS, framing, limits) → dispatcher (header, batch, errors) → operations/<one per op>
                                                                     → attributes, errors
"""
