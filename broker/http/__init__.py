"""The broker's HTTP adapters: the Pulsar-style admin REST API (:mod:`broker.http.admin_rest`)."""
