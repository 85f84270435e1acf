"""The broker's service layer: topics, ownership, load reports, subscriptions, dispatch."""
