"""Shipping: what was verified, packaged for phones (`doit dist`). The end of the data flow.

Like report/, it reads only records that vouch for their files, never reruns a tool: inventory.py
lists what the plan expects of a model, verified.py reads the records the way the report does,
manifest.py turns that into manifest.json (schema: manifest.schema.json), card.py into MODEL_CARD.md,
runtime.py adds the phone's QNN runtime libraries, package.py writes dist/<model>/ whole or not at all;
aipack.py writes the Android AI pack. Which build a device runs has one definition, qnn/select.py (below both
ship/ and doit verify, which follow it; so does the Java reference in java/).
"""
