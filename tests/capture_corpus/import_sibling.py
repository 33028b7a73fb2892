import corpus_helper

print(corpus_helper.VALUE)
