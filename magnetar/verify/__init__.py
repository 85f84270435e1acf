"""``magnetar verify``: a fault-injecting checker that proves nothing acknowledged is lost.

A workload (:mod:`.workload`) produces and consumes on a real multi-process cluster while a
nemesis (:mod:`.nemesis`) kills, pauses, starves and cuts off its processes on a seeded
schedule; the checker (:mod:`.checker`) judges the recorded history (:mod:`.history`) and the
report (:mod:`.report`) shows it. :mod:`.runner` puts them together. See docs/verify.md.
"""
