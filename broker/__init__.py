"""The broker: stateless partition owners in front of the bookie tier."""
