"""The bookie's framed data port: the data protocol over asyncio streams."""
