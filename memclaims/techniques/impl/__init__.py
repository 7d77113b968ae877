"""The torch code the techniques' hooks drive (``memclaims.techniques.<name>``), on real tensors and on the
sim's fake ones: imported by a hook when an engine calls it, and by the engines' loop for its types, never by
the registry (which loads before torch). Imports torch and ``core``; never an engine (``measure``, ``sim``)."""
