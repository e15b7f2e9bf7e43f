"""fastText subwords of a stored table: the n-gram hashing and composition (``hashing``) and
the ``ngrams`` array beside ``vectors`` (``ngrams``); the import of a fastText ``.bin`` into a
table is :mod:`embstore.store.fasttext`."""
