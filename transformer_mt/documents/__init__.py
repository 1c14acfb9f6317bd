"""The documents layer: texts and files as people bring them, turned into the sentences the decoding
engine translates and back. It splits lines into sentences, keeps numbers, addresses, codes and a user's
terms out of the model's hands, reads and writes Markdown, HTML and subtitles with their structure
untouched, and puts inline markup back around the words it marked."""
