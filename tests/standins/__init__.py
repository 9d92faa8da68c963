"""Stand-ins for things that do not exist here (an Android phone's adbd, ...), for tests."""
